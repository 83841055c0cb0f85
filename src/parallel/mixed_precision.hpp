#pragma once
/// @file MixedPrecisionHooks: bf16 mixed precision around the executor's units (as FSDP2's
/// MixedPrecisionPolicy(param_dtype = bf16)): after the data-parallel strategy has made a unit's
/// f32 parameters available (pre_forward / pre_backward), their bf16 compute copies are brought
/// up to date, so layers read bf16 weights while the optimizer keeps updating f32 masters.
#include "graph/executor.hpp"
#include "model/transformer.hpp"

namespace meshtrain {

class MixedPrecisionHooks final : public UnitHooks {
 public:
  /// Wraps `inner` (the GradientSync; may be null) for `model`. Every hook calls inner's first.
  MixedPrecisionHooks(Transformer& model, UnitHooks* inner) : model_(model), inner_(inner) {}
  void pre_forward(size_t unit, int64_t mb) override {
    if (inner_) inner_->pre_forward(unit, mb);
    model_.ensure_compute(unit);
  }
  void post_forward(size_t unit, int64_t mb) override {
    if (inner_) inner_->post_forward(unit, mb);
  }
  void pre_backward(size_t unit, int64_t mb) override {
    if (inner_) inner_->pre_backward(unit, mb);
    model_.ensure_compute(unit);
  }
  void post_backward(size_t unit, int64_t mb) override {
    if (inner_) inner_->post_backward(unit, mb);
  }

 private:
  Transformer& model_;
  UnitHooks* inner_;
};

}  // namespace meshtrain
