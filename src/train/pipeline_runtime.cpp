#include "train/pipeline_runtime.hpp"

#include <chrono>
#include <limits>
#include <stdexcept>

#include "util/trace.hpp"

namespace meshtrain {

namespace {
bool is_backward(ActionType t) { return t == ActionType::kBackward || t == ActionType::kBackwardWeight; }
}  // namespace

PipelineRuntime::PipelineRuntime(Transformer& model, std::vector<PipelineStage> stages, PipelineSchedule schedule,
                                 GradientSync& sync, const DataLoader& loader, const ParallelContext& pc,
                                 Communicator& pp, int64_t local_batch, int64_t microbatch_size, int64_t seq_len,
                                 int64_t rounds, float loss_grad_scale, std::function<bool(int64_t)> poisoned)
    : model_(model),
      schedule_(std::move(schedule)),
      sync_(sync),
      loader_(loader),
      pc_(pc),
      pp_(pp),
      local_batch_(local_batch),
      microbatch_size_(microbatch_size),
      seq_len_(seq_len),
      rounds_(rounds),
      loss_grad_scale_(loss_grad_scale),
      poisoned_(std::move(poisoned)) {
  if (pp.size() != schedule_.pp) throw std::invalid_argument("pipeline runtime: pp group size differs from the schedule's");
  const std::vector<int> mine = schedule_.stages_of(pp.rank());
  for (const PipelineStage& s : stages) stages_[s.index] = s.exec;
  if (stages_.size() != mine.size()) throw std::invalid_argument("pipeline runtime: an executor per stage of this rank");
  for (int s : mine)
    if (!stages_.count(s) || !stages_[s]) throw std::invalid_argument("pipeline runtime: no executor for stage " + std::to_string(s));
  if (local_batch_ != microbatch_size_ * schedule_.microbatches)
    throw std::invalid_argument("pipeline runtime: local batch " + std::to_string(local_batch_) + " is not " +
                                std::to_string(schedule_.microbatches) + " micro-batches of " +
                                std::to_string(microbatch_size_));
  actions_ = schedule_.ranks.at(size_t(pp.rank()));
  batches_ = communication_batches(actions_);
  // Validation's lists, checked like the step's: they complete on a stream-ordered backend.
  const PipelineSchedule eval = forward_only_schedule(schedule_);
  check_stream_ordered(eval);
  eval_actions_ = eval.ranks.at(size_t(pp.rank()));
  eval_batches_ = communication_batches(eval_actions_);
  for (size_t i = 0; i < actions_.size(); ++i) {
    if (!is_backward(actions_[i].type)) continue;
    auto [it, fresh] = backward_span_.try_emplace(actions_[i].stage, i, i);
    if (!fresh) it->second.second = i;
  }
  round_samples_.resize(size_t(local_batch_ * (seq_len_ + 1)));
}

PipelineRuntime::~PipelineRuntime() {
  // A step that threw leaves sends in flight; their buffers must outlive them.
  try {
    poll_sends(true);
  } catch (...) {
  }
}

Executor& PipelineRuntime::exec_of(int stage) {
  const auto it = stages_.find(stage);
  if (it == stages_.end()) throw std::logic_error("pipeline runtime: stage " + std::to_string(stage) + " is not on this rank");
  return *it->second;
}

int PipelineRuntime::tag(Kind kind, int stage, int mb) const {
  return (int(kind) * schedule_.num_stages() + stage) * schedule_.microbatches + mb;
}

StepContext& PipelineRuntime::context(int mb) {
  auto it = contexts_.find(mb);
  if (it != contexts_.end()) return it->second;
  const int32_t* samples = round_samples_.data() + size_t(mb) * size_t(microbatch_size_ * (seq_len_ + 1));
  const bool poison = poison_round_ && mb + 1 == schedule_.microbatches;
  const float scale = poison ? std::numeric_limits<float>::quiet_NaN() : loss_grad_scale_;
  return contexts_.emplace(mb, model_.make_context(samples, microbatch_size_, seq_len_, scale, true)).first->second;
}

Tensor PipelineRuntime::message_buffer(int mb) {
  const StepContext& ctx = context(mb);
  const int64_t tokens = tp_local_tokens(ctx.tp, ctx.batch * ctx.seq_len);
  return model_.device().empty({tokens, model_.args().dim}, ctx.act_dtype, MemCategory::kActivations);
}

Tensor PipelineRuntime::take(Kind kind, int stage, int mb) {
  const Key key{int(kind), stage, mb};
  if (auto it = ready_.find(key); it != ready_.end()) {
    Tensor t = it->second;
    ready_.erase(it);
    return t;
  }
  auto it = receiving_.find(key);
  if (it == receiving_.end())
    throw std::logic_error("pipeline runtime: stage " + std::to_string(stage) + " micro-batch " + std::to_string(mb) +
                           " has no " + (kind == kActivation ? "input" : "output gradient"));
  {
    trace::Span span(kind == kActivation ? "wait recv activation" : "wait recv gradient", "comm_wait");
    const auto t0 = std::chrono::steady_clock::now();
    it->second.work->wait();
    recv_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Tensor t = it->second.buffer;
  receiving_.erase(it);
  return t;
}

void PipelineRuntime::poll_sends(bool block) {
  for (auto it = sending_.begin(); it != sending_.end();) {
    if (block) {
      it->work->wait();
    } else if (!it->work->test()) {
      ++it;
      continue;
    }
    it = sending_.erase(it);
  }
}

void PipelineRuntime::run_action(const Action& a, int64_t round) {
  const int s = a.stage, j = a.microbatch;
  const int last_stage = schedule_.num_stages() - 1;
  const size_t index = size_t(&a - actions_.data());
  switch (a.type) {
    case ActionType::kForward: {
      StepContext& ctx = context(j);
      const Tensor in = s == 0 ? Tensor() : take(kActivation, s, j);
      sync_.set_micro_batch_role(false, false);
      const double before = ctx.loss_sum;
      Tensor out = exec_of(s).forward(j, ctx, in);
      if (s == last_stage)
        loss_sum_ += ctx.loss_sum - before;
      else
        ready_[{kActivation, s + 1, j}] = out;  // for F(s + 1) here, or SEND_F
      break;
    }
    case ActionType::kBackward:
    case ActionType::kBackwardInput: {
      StepContext& ctx = context(j);
      const Tensor dout = s == last_stage ? Tensor() : take(kGradient, s, j);
      if (poison_round_ && j + 1 == schedule_.microbatches && dout.defined())
        model_.device().fill(dout, std::numeric_limits<float>::quiet_NaN());
      bool first = false, last = false;
      if (a.type == ActionType::kBackward) {
        const auto& span = backward_span_.at(s);
        first = round == 0 && span.first == index;
        last = round + 1 == rounds_ && span.second == index;
      }
      sync_.set_micro_batch_role(first, last);
      Executor& exec = exec_of(s);
      Tensor dx = a.type == ActionType::kBackward ? exec.backward(j, ctx, dout) : exec.backward_input(j, ctx, dout);
      if (s > 0) ready_[{kGradient, s - 1, j}] = dx;  // for B / I(s − 1) here, or SEND_B
      break;
    }
    case ActionType::kBackwardWeight: {
      const auto& span = backward_span_.at(s);
      sync_.set_micro_batch_role(round == 0 && span.first == index, round + 1 == rounds_ && span.second == index);
      exec_of(s).backward_weight(j);
      break;
    }
    default:
      throw std::logic_error("pipeline runtime: " + to_string(a) + " is not a compute action");
  }
}

void PipelineRuntime::post_communication(const Action* first, const Action* last) {
  std::vector<P2POp> ops;
  std::vector<Key> receives;  // the receive key of each op (sends: unused)
  for (const Action* a = first; a != last; ++a) {
    const int s = a->stage, j = a->microbatch;
    const bool act = a->type == ActionType::kSendActivation || a->type == ActionType::kRecvActivation;
    const Kind kind = act ? kActivation : kGradient;
    if (a->type == ActionType::kSendActivation || a->type == ActionType::kSendGradient) {
      const int to_stage = act ? s + 1 : s - 1;
      const Key key{kind, to_stage, j};
      auto it = ready_.find(key);
      if (it == ready_.end())
        throw std::logic_error("pipeline runtime: " + to_string(*a) + " before the action producing its tensor");
      ops.push_back({true, it->second, schedule_.rank_of(to_stage), tag(kind, to_stage, j)});
      ready_.erase(it);
      receives.emplace_back();
    } else {
      const int from_stage = act ? s - 1 : s + 1;
      ops.push_back({false, message_buffer(j), schedule_.rank_of(from_stage), tag(kind, s, j)});
      receives.push_back({kind, s, j});
    }
  }
  trace::Span span("issue send/recv", "comm_issue");
  int64_t bytes = 0;
  for (const P2POp& op : ops) bytes += op.send ? int64_t(op.tensor.nbytes()) : 0;
  span.arg("bytes", bytes).arg("ops", int64_t(ops.size())).arg("group", pp_.name());
  std::vector<std::unique_ptr<Work>> works = pp_.send_recv_batch(ops);
  for (size_t k = 0; k < ops.size(); ++k) {
    Pending p{ops[k].tensor, std::move(works[k])};
    if (ops[k].send) sending_.push_back(std::move(p));
    else receiving_[receives[k]] = std::move(p);
  }
}

void PipelineRuntime::run_round(int64_t step, int64_t round) {
  loader_.micro_batch(round, pc_.data->rank(), pc_.data->size(), local_batch_, round_samples_.data());
  poison_round_ = round + 1 == rounds_ && poisoned_ && poisoned_(step);
  contexts_.clear();
  // Each batch (one NCCL group) is the one check_stream_ordered() modelled when it proved the
  // list free of deadlock: communication_batches(), shared with the check.
  size_t b = 0;
  for (size_t i = 0; i < actions_.size();) {
    if (b < batches_.size() && batches_[b].begin == i) {
      post_communication(actions_.data() + i, actions_.data() + batches_[b].end);
      i = batches_[b++].end;
    } else {
      run_action(actions_[i++], round);
    }
    poll_sends(false);
  }
  poll_sends(true);
  if (!ready_.empty() || !receiving_.empty())
    throw std::logic_error("pipeline runtime: the schedule left " + std::to_string(ready_.size() + receiving_.size()) +
                           " tensors unused");
  for (const auto& [s, exec] : stages_)
    if (exec->in_flight() != 0) throw std::logic_error("pipeline runtime: stage " + std::to_string(s) + " left micro-batches in flight");
  contexts_.clear();
}

double PipelineRuntime::run(int64_t step) {
  loss_sum_ = 0;
  for (int64_t r = 0; r < rounds_; ++r) run_round(step, r);
  return loss_sum_;
}

EvalSums PipelineRuntime::evaluate(const int32_t* samples, int64_t n) {
  StepContext ctx = model_.make_context(samples, n, seq_len_, 0.0f, /*need_backward=*/false);
  const int last_stage = schedule_.num_stages() - 1;
  std::map<int, Tensor> inputs;   // stage → its input: produced here, or received and waited for
  std::map<int, Pending> receiving;  // stage → the receive of its input
  std::vector<Pending> sends;
  for (size_t i = 0, b = 0; i < eval_actions_.size();) {
    if (b < eval_batches_.size() && eval_batches_[b].begin == i) {
      // One batch, as check_stream_ordered() modelled it in the constructor.
      std::vector<P2POp> ops;
      for (; i < eval_batches_[b].end; ++i) {
        const int s = eval_actions_[i].stage;
        if (eval_actions_[i].type == ActionType::kSendActivation) {
          ops.push_back({true, inputs.at(s + 1), schedule_.rank_of(s + 1), tag(kActivation, s + 1, 0)});
          inputs.erase(s + 1);
        } else {
          Tensor in = model_.device().empty({tp_local_tokens(ctx.tp, n * ctx.seq_len), model_.args().dim},
                                            ctx.act_dtype, MemCategory::kActivations);
          ops.push_back({false, in, schedule_.rank_of(s - 1), tag(kActivation, s, 0)});
        }
      }
      std::vector<std::unique_ptr<Work>> works = pp_.send_recv_batch(ops);
      for (size_t k = 0; k < ops.size(); ++k) {
        Pending p{ops[k].tensor, std::move(works[k])};
        if (ops[k].send) sends.push_back(std::move(p));
        else receiving[eval_actions_[eval_batches_[b].begin + k].stage] = std::move(p);
      }
      ++b;
      continue;
    }
    const int s = eval_actions_[i++].stage;  // a forward
    Tensor in;
    if (s > 0) {
      if (auto it = receiving.find(s); it != receiving.end()) {
        const auto t0 = std::chrono::steady_clock::now();
        it->second.work->wait();
        recv_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        inputs[s] = it->second.buffer;
        receiving.erase(it);
      }
      in = inputs.at(s);
      inputs.erase(s);
    }
    sync_.begin_evaluation();
    Tensor out = exec_of(s).forward_only(ctx, in);
    if (s != last_stage) inputs[s + 1] = out;  // for F(s + 1) here, or SEND_F
  }
  for (Pending& p : sends) p.work->wait();
  return {ctx.loss_sum, ctx.num_targets};
}

std::string PipelineRuntime::describe() const {
  return schedule_.name + ", " + std::to_string(schedule_.microbatches) + " micro-batches of " +
         std::to_string(microbatch_size_) + " per round, " + std::to_string(rounds_) + " round" +
         (rounds_ == 1 ? "" : "s") + " per step, " + std::to_string(schedule_.stages_per_rank) + " stage" +
         (schedule_.stages_per_rank == 1 ? "" : "s") + " per rank";
}

double PipelineRuntime::take_recv_wait_seconds() {
  const double s = recv_wait_s_;
  recv_wait_s_ = 0;
  return s;
}

}  // namespace meshtrain
