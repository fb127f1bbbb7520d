#include "replay/checkpoint.h"

#include "replay/reentrant_checkpoint.h"
#include "replay/region.h"
#include "replay/rng_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/input_buffer.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>

namespace hpac {
namespace {

using torch::autograd::Engine;
using torch::autograd::SavedVariableHooks;
using torch::autograd::variable_list;

struct PackedMeta {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  c10::Device device;
};

class Frame;

// Note [The recompute stops early]
// A recompute exists to give backward the saved tensors the frame does not
// hold (Note [Frames hold what needs no recompute]). Once it has packed the
// last of them, whatever the checkpointed function still runs makes nothing
// backward reads: its module code, dispatch, autograd recording and kernels
// are pure cost. So the recompute stops there, as torch.utils.checkpoint's
// early stop does: the pack hook that receives the last tensor wanted throws
// StopRecompute, which unwinds the function (RAII restores what it changed;
// the region's phase ends unfinished, which releases the kept entries the
// recompute never reached without a warning) and is caught by the frame. The
// difference from torch's is what counts as wanted: torch's frame holds
// nothing, so its recompute runs to the last tensor autograd saved; hpac's
// stops at the last one it does not hold. A plan that keeps what the tail of a
// region saves lets the recompute stop before the tail (Note [The recompute's
// fixed cost], policy/budget_plan.h). The determinism check covers the
// tensors the recompute produced.
struct StopRecompute {};

// Which frame the tensors autograd saves on this thread belong to, and whether
// they are the forward's (placeholders) or the recompute's (kept for unpack).
struct PackTarget {
  Frame* frame = nullptr;
  bool recompute = false;
};
thread_local PackTarget tls_pack;

class PackScope {
 public:
  PackScope(Frame* frame, bool recompute) : previous_(tls_pack) { tls_pack = PackTarget{frame, recompute}; }
  ~PackScope() { tls_pack = previous_; }

 private:
  PackTarget previous_;
};

// Frame: one non-reentrant checkpoint call. Owned by the placeholders the
// forward left in the autograd graph (ForwardHooks), so it lives exactly as
// long as the graph can still ask for a saved tensor, and nothing it holds
// points back into the graph (inputs and cached outputs are detached aliases).
class Frame : public std::enable_shared_from_this<Frame> {
 public:
  Frame(CheckpointFn fn, const std::vector<at::Tensor>& inputs, const CheckpointOptions& options)
      : fn_(std::move(fn)),
        preserve_rng_(options.preserve_rng_state),
        determinism_check_(options.determinism_check),
        hold_saved_(options.hold_saved),
        early_stop_(options.early_stop),
        invocation_(options.policy, InvocationOptions{options.allow_cache_mutation, options.explain, options.routing,
                                                      options.state_writes, options.respect_saved_tensors_hooks}),
        stats_out_(options.stats_out) {
    inputs_.reserve(inputs.size());
    for (const at::Tensor& t : inputs) {
      inputs_.push_back(t.defined() ? detachedAlias(t) : t);
      requires_grad_.push_back(t.defined() && t.requires_grad());
    }
    if (preserve_rng_) rng_ = RngState::capture(inputs);
  }

  ~Frame() {
    if (stats_out_) *stats_out_ = invocation_.stats();
  }

  Invocation& invocation() { return invocation_; }

  // Note [Frames hold what needs no recompute]: `held` receives the alias the frame holds, if the invocation gives one.
  size_t pack(const at::Tensor& t, at::Tensor* held) {
    invocation_.noteAutogradSaved(t);
    *held = hold_saved_ ? invocation_.holdSaved(t) : at::Tensor();
    held_.push_back(held->defined());
    packed_.push_back(PackedMeta{t.sizes().vec(), t.scalar_type(), t.device()});
    return packed_.size() - 1;
  }

  // After the forward region: nothing is left to compute when every saved tensor is held.
  void endForward() {
    if (std::find(held_.begin(), held_.end(), false) != held_.end()) return;  // a recompute may still be asked for
    invocation_.releaseKept();
    // No recompute can follow: what only a recompute reads goes now.
    inputs_.clear();
    rng_ = RngState{};
    fn_ = nullptr;
  }

  // Note [The recompute stops early]
  void recomputePack(const at::Tensor& t) {
    recomputed_.push_back(detachedAlias(t));
    if (recomputed_.size() > stop_after_) throw StopRecompute{};
  }

  at::Tensor unpack(size_t index, const at::Tensor& held, uint32_t version) {
    if (held.defined()) {
      const uint32_t now = held.unsafeGetTensorImpl()->version_counter().current_version();
      if (now == version) return held;
      // Modified in place since autograd saved it: the recompute gives what the region keeps (and says so when
      // that was written too); without a checkpoint autograd would refuse the same.
      TORCH_CHECK(!invocation_.keptReleased(), "hpac: checkpoint invocation ", invocation_.id(), ": saved tensor #",
                  index, " (", held.sizes(), " ", held.scalar_type(), ") was modified by an in-place operation after "
                  "the forward saved it for backward (version ", version, ", now ", now, "); autograd refuses this "
                  "without a checkpoint too. Clone it before writing to it, or write out of place.");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (index >= recomputed_.size() || !recomputed_[index].defined()) recompute(index);
    TORCH_INTERNAL_ASSERT(index < recomputed_.size() && recomputed_[index].defined());
    return std::exchange(recomputed_[index], at::Tensor());
  }

 private:
  void recompute(size_t wanted) {
    std::vector<at::Tensor> inputs;
    inputs.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      at::Tensor t = inputs_[i].defined() ? detachedAlias(inputs_[i]) : inputs_[i];
      if (requires_grad_[i]) t.set_requires_grad(true);
      inputs.push_back(std::move(t));
    }
    recomputed_.clear();
    recomputed_.reserve(packed_.size());
    // Note [The recompute stops early]: the last placeholder the frame does not hold, or the one asked for.
    stop_after_ = early_stop_ ? wanted : std::numeric_limits<size_t>::max();
    for (size_t i = held_.size(); early_stop_ && i-- > wanted + 1;) {
      if (!held_[i]) {
        stop_after_ = i;
        break;
      }
    }
    try {
      c10::optional<RngFork> rng;
      if (preserve_rng_) rng.emplace(rng_);
      at::AutoGradMode grad_enabled(true);
      PackScope pack(this, /*recompute=*/true);
      RegionGuard region(invocation_, Phase::kRecompute);
      fn_(inputs);  // outputs dropped: only what autograd saved is needed
      region.end();
    } catch (const StopRecompute&) {
    }
    if (determinism_check_) checkDeterminism();
    // Held tensors come from their placeholders; the recompute's aliases of them would only outlive those.
    for (size_t i = 0; i < held_.size() && i < recomputed_.size(); ++i) {
      if (held_[i] && i != wanted) recomputed_[i] = at::Tensor();
    }
  }

  void checkDeterminism() const {
    // A recompute that stopped early produced a prefix (Note [The recompute stops early]).
    const bool prefix = early_stop_ && recomputed_.size() == stop_after_ + 1;
    TORCH_CHECK(recomputed_.size() == packed_.size() || prefix, "hpac: checkpoint invocation ", invocation_.id(),
                " is not deterministic: the forward saved ", packed_.size(),
                " tensors for backward but the recompute saved ", recomputed_.size(),
                ". The checkpointed function must run the same ops in backward as in forward (no "
                "data-dependent branches on state that changes); set determinism_check=false only if the "
                "difference is known to be harmless.");
    for (size_t i = 0; i < recomputed_.size() && i < packed_.size(); ++i) {
      const PackedMeta& m = packed_[i];
      const at::Tensor& r = recomputed_[i];
      if (r.sizes() != c10::IntArrayRef(m.sizes) || r.scalar_type() != m.dtype || r.device() != m.device) {
        std::ostringstream msg;
        msg << "hpac: checkpoint invocation " << invocation_.id() << " is not deterministic: saved tensor #" << i
            << " was " << c10::IntArrayRef(m.sizes) << " " << m.dtype << " on " << m.device
            << " in forward but " << r.sizes() << " " << r.scalar_type() << " on " << r.device()
            << " in the recompute. The checkpointed function must run the same ops in backward as in forward.";
        TORCH_CHECK(false, msg.str());
      }
    }
  }

  CheckpointFn fn_;
  std::vector<at::Tensor> inputs_;
  std::vector<bool> requires_grad_;
  const bool preserve_rng_;
  const bool determinism_check_;
  const bool hold_saved_;
  const bool early_stop_;
  RngState rng_;
  Invocation invocation_;
  std::vector<PackedMeta> packed_;
  std::vector<bool> held_;  // per placeholder: its tensor is held (Note [Frames hold what needs no recompute])
  std::vector<at::Tensor> recomputed_;
  size_t stop_after_ = 0;  // the recompute's last placeholder (Note [The recompute stops early])
  std::shared_ptr<InvocationStats> stats_out_;
  std::mutex mutex_;
};

// The forward's placeholder: remembers its index; the tensor itself is
// dropped, which is the point of checkpointing, unless the region keeps it
// anyway (Note [Frames hold what needs no recompute]).
class ForwardHooks final : public SavedVariableHooks {
 public:
  explicit ForwardHooks(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    index_ = frame_->pack(tensor, &held_);
    if (held_.defined()) version_ = held_.unsafeGetTensorImpl()->version_counter().current_version();
  }
  at::Tensor call_unpack_hook() override { return frame_->unpack(index_, held_, version_); }

 private:
  std::shared_ptr<Frame> frame_;
  size_t index_ = 0;
  at::Tensor held_;
  uint32_t version_ = 0;
};

// The recompute's saved tensors are handed to the frame; the recompute graph
// itself is dropped and never unpacked.
class RecomputeHooks final : public SavedVariableHooks {
 public:
  explicit RecomputeHooks(Frame* frame) : frame_(frame) {}
  void call_pack_hook(const at::Tensor& tensor) override { frame_->recomputePack(tensor); }
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(false, "hpac: a tensor saved during a checkpoint recompute was unpacked; backward through the "
                       "outputs of a recompute is not supported");
  }

 private:
  Frame* frame_;
};

// Note [Saved-tensor hooks from C++]
// libtorch's default saved-tensor hooks are Python-only (at::SavedTensorDefaultHooks
// holds PyObject*), and Engine::get_default_saved_variable_hooks() returns
// nullptr in a pure C++ process. Every SavedVariable asks the default engine
// for hooks, so hpac installs a subclass of Engine (set_default_engine_stub)
// that answers with its own hooks while a checkpoint frame is packing on this
// thread, and delegates everything else — execution included — to whatever
// engine was installed before it (the base engine, or Python's engine, whose
// saved_tensors_hooks keep working).
//
// The graph root's pointer type changed across torch versions (shared_ptr<Node>
// in 1.13, intrusive_ptr<Node> in 2.x); it is read off the base class's own
// signature so that the override matches whichever torch this is built against.
template <typename MemberFn>
struct SecondParameter;
template <typename R, typename C, typename A1, typename A2, typename A3>
struct SecondParameter<R (C::*)(A1, A2, A3)> {
  using type = A2;
};
using GraphRootPtr = SecondParameter<decltype(&Engine::execute_with_graph_task)>::type;

class CheckpointEngine final : public Engine {
 public:
  explicit CheckpointEngine(Engine& previous) : previous_(previous) {}

  variable_list execute(const torch::autograd::edge_list& roots, const variable_list& inputs, bool keep_graph,
                        bool create_graph, bool accumulate_grad,
                        const torch::autograd::edge_list& outputs) override {
    return previous_.execute(roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }

  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task,
      GraphRootPtr graph_root, torch::autograd::InputBuffer&& input_buffer) override {
    return previous_.execute_with_graph_task(graph_task, std::move(graph_root), std::move(input_buffer));
  }

  std::unique_ptr<torch::autograd::AnomalyMetadata> make_anomaly_metadata() override {
    return previous_.make_anomaly_metadata();
  }

  std::unique_ptr<SavedVariableHooks> get_default_saved_variable_hooks() override {
    const PackTarget& target = tls_pack;
    if (target.frame == nullptr) return previous_.get_default_saved_variable_hooks();
    if (target.recompute) return std::make_unique<RecomputeHooks>(target.frame);
    return std::make_unique<ForwardHooks>(target.frame->shared_from_this());
  }

  Engine& previous() { return previous_; }

 private:
  Engine& previous_;
};

std::mutex engine_mutex;
CheckpointEngine* installed_engine = nullptr;  // leaked on purpose: engines outlive static destruction

Engine& checkpointEngineStub() {
  return *installed_engine;
}

}  // namespace

void installCheckpointEngine() {
  std::lock_guard<std::mutex> lock(engine_mutex);
  Engine& current = Engine::get_default_engine();
  if (installed_engine != nullptr && &current == installed_engine) return;
  // First use, or someone (Python's torch import) installed another engine
  // since: chain over whatever is current now.
  installed_engine = new CheckpointEngine(current);
  torch::autograd::set_default_engine_stub(&checkpointEngineStub);
}

std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  TORCH_CHECK(fn, "hpac::checkpoint: fn is an empty std::function");
  if (!at::GradMode::is_enabled()) {
    // Evaluation: nothing will be differentiated, so nothing is cached or recomputed.
    return fn(inputs);
  }
  if (options.use_reentrant) return reentrantCheckpoint(fn, inputs, options);

  installCheckpointEngine();
  auto frame = std::make_shared<Frame>(fn, inputs, options);
  std::vector<at::Tensor> outputs;
  {
    // The region ends after the pack scope: its end hands what it keeps to the hooks around it, which the engine
    // gives only outside a pack scope (Note [Outer saved-tensor hooks]). This frame pushes no hooks of its own.
    RegionGuard region(frame->invocation(), Phase::kForward);
    frame->invocation().useOuterHooks(OuterHooks::capture(/*frame_hooks=*/0));
    {
      PackScope pack(frame.get(), /*recompute=*/false);
      outputs = fn(inputs);
    }
    region.end();  // Note [Ending a region can fail]: outside the pack scope, as the comment above says
  }
  frame->endForward();
  return outputs;
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  TORCH_CHECK(fn, "hpac::checkpoint: fn is an empty std::function");
  auto outputs = checkpoint([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; },
                            std::vector<at::Tensor>{input}, options);
  return outputs[0];
}

}  // namespace hpac
