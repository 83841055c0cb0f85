#pragma once
/// @file Float8 training of a model's linear layers: TorchTitan's Float8LinearConverter
/// (torchtitan/components/quantization/float8.py, which swaps nn.Linear for TorchAO's
/// Float8Linear). The converted layers are the blocks' nn.Linear modules: attention wq / wk / wv
/// / wo, the dense FFN's w1 / w2 / w3, the MoE shared experts' w1 / w2 / w3 and the MoE router's
/// gate, each unless filter_fqns names it or a dimension is not a multiple of 16
/// (float8_converts). Not converted, as in TorchTitan:
/// the routed experts (TorchTitan's GroupedExperts are not nn.Linear; only the separate
/// quantize.grouped_mm converter touches them) and the token embedding. The output head is an
/// nn.Linear that TorchTitan would convert; meshtrain keeps it in high precision and the deck
/// must say so (filter_fqns covering "output", as every TorchTitan preset writes; config
/// refuses otherwise).
#include <string>
#include <vector>

#include "config/float8_config.hpp"
#include "model/transformer.hpp"

namespace meshtrain {

/// Marks this model's convertible linear weights with the recipe of `f8` (Parameter::float8,
/// emulate as f8.emulate) and returns their module names ("layers.0.attention.wq", ...), in parameter order. Under
/// tensor parallelism a weight split over tp also gets the model's tp group
/// (Parameter::float8_tp): the scaling groups that span the split reduce their amax over it.
/// Whether a linear converts is decided on its global shape, the same for every tp degree.
/// @throws std::invalid_argument for an unknown recipe name.
std::vector<std::string> convert_float8_linears(Transformer& model, const Float8Config& f8);

}  // namespace meshtrain
