#include "plugin/ops.h"

#include "plugin/fallback.h"
#include "policy/budget_policy.h"
#include "policy/policy_kind.h"
#include "policy/step_plan.h"
#include "policy/byte_size.h"
#include "policy/step_driver.h"
#include "policy/step_record.h"
#include "policy/traced_policy.h"
#include "replay/dispatch_key.h"
#include "replay/explain.h"
#include "replay/invocation.h"
#include "replay/op_cost.h"
#include "replay/region.h"
#include "replay/tracking_allocator.h"

#include <torch/custom_class.h>
#if HPAC_TORCH_AT_LEAST(2, 5)
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/zeros.h>
#endif

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <vector>

namespace hpac {
namespace {

c10::Dict<std::string, int64_t> toDict(const InvocationStats& s) {
  c10::Dict<std::string, int64_t> d;
  d.insert("ops_forward", s.ops_forward);
  d.insert("ops_recompute", s.ops_recompute);
  d.insert("saved", s.saved);
  d.insert("saved_bytes", s.saved_bytes);
  d.insert("served", s.served);
  d.insert("recomputed", s.recomputed);
  d.insert("skipped", s.skipped);
  d.insert("ignored", s.ignored);
  d.insert("recomputes", s.recomputes);
  d.insert("unserved", s.unserved);
  d.insert("unserved_bytes", s.unserved_bytes);
  d.insert("routing_checked", s.routing_checked);
  d.insert("routing_kept_bytes", s.routing_kept_bytes);
  d.insert("state_writes", s.state_writes);
  d.insert("state_writes_skipped", s.state_writes_skipped);
  d.insert("packed", s.packed);
  d.insert("held", s.held);
  return d;
}

// One checkpoint call seen from Python: its invocation, and the region guard
// between enter() and exit(). The guard lives on the thread that entered.
class InvocationHandle : public torch::CustomClassHolder {
 public:
  InvocationHandle(const std::string& kind, const std::vector<std::string>& save_list, bool allow_cache_mutation,
                   const std::string& routing, const std::string& state_writes, bool respect_saved_tensors_hooks)
      : InvocationHandle(policyForKind(parsePolicyKind(kind, "hpac.Invocation"), save_list, "hpac.Invocation"),
                         options(allow_cache_mutation, routing, state_writes, respect_saved_tensors_hooks)) {}
  InvocationHandle(const PolicyFactory& policy, const InvocationOptions& options)
      : invocation_(std::make_unique<Invocation>(policy, options)) {}

  static InvocationOptions options(bool allow_cache_mutation, const std::string& routing,
                                   const std::string& state_writes, bool respect_saved_tensors_hooks) {
    InvocationOptions o;
    o.allow_cache_mutation = allow_cache_mutation;
    o.routing = routingRuleOrThrow(routing, "hpac: routing");
    o.state_writes = stateWriteRuleOrThrow(state_writes, "hpac: state_writes");
    o.respect_saved_tensors_hooks = respect_saved_tensors_hooks;
    return o;
  }

  int64_t id() const { return static_cast<int64_t>(invocation_->id()); }
  // The C++ Invocation's address, for the C API's per-op calls (plugin/c_api.h); valid while this handle lives.
  int64_t address() const { return static_cast<int64_t>(reinterpret_cast<intptr_t>(invocation_.get())); }

  void enter(const std::string& phase) {
    TORCH_CHECK(phase == "forward" || phase == "recompute", "hpac.Invocation.enter: unknown phase '", phase,
                "'; allowed: forward, recompute");
    TORCH_CHECK(!guard_, "hpac.Invocation.enter: invocation ", id(), " is already inside its ", toString(phase_),
                " region; exit() it first");
    guard_ = std::make_unique<RegionGuard>(*invocation_, phase == "forward" ? Phase::kForward : Phase::kRecompute);
    phase_ = phase == "forward" ? Phase::kForward : Phase::kRecompute;
    // Python regions are entered inside their checkpoint frame's saved_tensors_hooks (torch.utils.checkpoint's,
    // hpac.checkpoint's): one pair on top that is not the user's (Note [Outer saved-tensor hooks]).
    if (phase_ == Phase::kForward) invocation_->useOuterHooks(OuterHooks::capture(/*frame_hooks=*/1));
    thread_ = std::this_thread::get_id();
  }

  // completed: false when the phase ends by a Python exception (Note [Decisions are recorded]).
  void exit(bool completed) {
    TORCH_CHECK(guard_, "hpac.Invocation.exit: invocation ", id(), " is not inside a region");
    TORCH_CHECK(thread_ == std::this_thread::get_id(), "hpac.Invocation.exit: invocation ", id(),
                " was entered on another thread; enter and exit a region on the same thread");
    if (!completed) guard_->abandon();
    std::unique_ptr<RegionGuard> guard = std::move(guard_);
    guard->end();  // throws what ending threw (Note [Ending a region can fail]); the region is left either way
  }

  c10::Dict<std::string, int64_t> stats() const { return toDict(invocation_->stats()); }
  int64_t storedEntries() const { return static_cast<int64_t>(invocation_->storedEntries()); }
  void recordOps(bool on) { invocation_->recordOps(on); }
  // Whether note_saved wants this forward's saved tensors (a budget profile, or a plan that skips ops).
  bool watchesSaved() const { return invocation_->watchesAutogradSaves(); }
  void noteSaved(const at::Tensor& t) { invocation_->noteAutogradSaved(t); }
  // hpac.checkpoint's frame (Note [Frames hold what needs no recompute]): [the alias it may hold instead of a
  // placeholder], or [] (a list: torch 1.13's custom classes do not return optional tensors to Python); after a
  // forward that held everything, release_kept().
  std::vector<at::Tensor> holdSaved(const at::Tensor& t) {
    at::Tensor held = invocation_->holdSaved(t);
    if (!held.defined()) return {};
    // A Python scalar autograd saved (x / 2.0's divisor on torch 1.13) is a wrapped-number tensor, which reaches
    // Python as a float; the frame's alias is an ordinary 0-dim tensor (it promotes as the wrapped one does).
    if (held.unsafeGetTensorImpl()->is_wrapped_number()) held.unsafeGetTensorImpl()->set_wrapped_number(false);
    return {held};
  }
  void releaseKept() { invocation_->releaseKept(); }
  void respectSavedTensorsHooks(bool respect) { invocation_->respectSavedTensorsHooks(respect); }
  bool keptReleased() const { return invocation_->keptReleased(); }
  void nameState(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
    TORCH_CHECK(tensors.size() == names.size(), "hpac.Invocation.name_state: ", tensors.size(), " tensors but ",
                names.size(), " names");
    invocation_->nameState(tensors, names);
  }
  std::vector<std::string> opLog() const { return invocation_->opLog(); }
  void explain() {
    TORCH_CHECK(invocation_->stats().ops_forward == 0 && !guard_, "hpac.Invocation.explain: invocation ", id(),
                " has already run its forward; turn explain on before it");
    invocation_->recordDecisions(std::make_shared<DecisionRecorder>());
  }
  const Invocation& invocation() const { return *invocation_; }

 private:
  std::unique_ptr<Invocation> invocation_;
  std::unique_ptr<RegionGuard> guard_;
  Phase phase_ = Phase::kForward;
  std::thread::id thread_;
};

// One budget region seen from Python (hpac.budget): it outlives the checkpoint
// calls it serves, so its profile and plan carry over from step to step.
class BudgetRegionHandle : public torch::CustomClassHolder {
 public:
  // plan_text given: the region replays that plan (Note [Plan files]); fraction and bytes must then be None.
  BudgetRegionHandle(c10::optional<double> fraction, c10::optional<int64_t> bytes, int64_t profile_invocations,
                     int64_t max_replans, bool skip_dead, c10::optional<std::string> plan_text,
                     const std::string& plan_source, const std::string& cost) {
    const BudgetCost parsed_cost = parseBudgetCost(cost);
    if (plan_text) {
      TORCH_CHECK(!fraction && !bytes, "hpac budget: a plan carries its budget; give either a plan or a fraction / "
                  "bytes, not both");
      region_ = BudgetRegion::fromPlanText(*plan_text, plan_source);
      return;
    }
    BudgetSpec spec = makeBudgetSpec(fraction ? std::optional<double>(*fraction) : std::nullopt,
                                     bytes ? std::optional<int64_t>(*bytes) : std::nullopt, profile_invocations,
                                     max_replans);
    spec.skip_dead = skip_dead;
    spec.cost = parsed_cost;
    region_ = std::make_shared<BudgetRegion>(spec);
  }

  std::string planText() const { return region_->planText(); }

  // The last complete profile, per op (Note [Estimated op costs]): name, occurrence, the µs the plan weighs it
  // by, the roofline estimate, flops, bytes moved.
  std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<double>, std::vector<double>,
             std::vector<double>, std::vector<int64_t>>
  profile() const {
    std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<double>, std::vector<double>,
               std::vector<double>, std::vector<int64_t>>
        out;
    for (const ProfiledOp& p : region_->status().profile) {
      std::get<0>(out).push_back(p.op);
      std::get<1>(out).push_back(p.occurrence);
      std::get<2>(out).push_back(p.micros);
      std::get<3>(out).push_back(p.estimated_micros);
      std::get<4>(out).push_back(p.flops);
      std::get<5>(out).push_back(p.bytes_moved);
    }
    return out;
  }
  std::string planSource() const { return region_->planSource(); }

  // Note [An exact oracle for the planner]: the last profile's groups (group per op, -1 for a view; per group its
  // bytes, µs, collective 0/1), and the text of the plan keeping the groups flagged 1.
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<double>, std::vector<int64_t>> groups() const {
    return groupsTuple(region_->groups());
  }
  std::string planTextKeeping(const std::vector<int64_t>& keep) const {
    return region_->planTextKeeping(std::vector<bool>(keep.begin(), keep.end()));
  }
  static std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<double>, std::vector<int64_t>>
  groupsTuple(const PlanGroups& g) {
    return {g.group_of, g.bytes, g.micros, std::vector<int64_t>(g.collective.begin(), g.collective.end())};
  }

  // A new checkpoint call of this region.
  c10::intrusive_ptr<InvocationHandle> invocation(bool allow_cache_mutation, const std::string& routing,
                                                  const std::string& state_writes, bool respect_saved_tensors_hooks) {
    return c10::make_intrusive<InvocationHandle>(
        region_->factory(),
        InvocationHandle::options(allow_cache_mutation, routing, state_writes, respect_saved_tensors_hooks));
  }

  std::string stage() const { return toString(region_->status().stage); }

  // Note [The step's peak as events] (policy/step_plan.h): per budget in bytes, (budget, kept bytes, of them the
  // bytes autograd does not save, predicted recompute µs, the forward's bytes: Note [A forward, op by op]); and
  // replan to one of them.
  using RegionCandidates = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                                      std::vector<double>, std::vector<int64_t>>;
  RegionCandidates candidates(const std::vector<int64_t>& budgets) const {
    RegionCandidates out;
    for (const BudgetRegion::Candidate& c : region_->candidates(budgets)) {
      std::get<0>(out).push_back(c.budget_bytes);
      std::get<1>(out).push_back(c.kept_bytes);
      std::get<2>(out).push_back(c.backward_bytes);
      std::get<3>(out).push_back(c.recompute_micros);
      std::get<4>(out).push_back(c.forward_bytes);
    }
    return out;
  }
  // Note [A forward, op by op]: (the profile's forward as it ran, the forward unwrapped); -1 where not measured.
  std::tuple<int64_t, int64_t> forwardBytes() const {
    const BudgetRegion::ForwardBytes f = region_->forwardBytes();
    return {f.profiled, f.off};
  }
  void replan(int64_t budget_bytes) { region_->replan(budget_bytes); }
  const std::shared_ptr<BudgetRegion>& region() const { return region_; }

  c10::Dict<std::string, int64_t> status() const {
    const BudgetRegion::Status st = region_->status();
    c10::Dict<std::string, int64_t> d;
    int64_t saved = 0, skipped = 0;
    for (bool s : st.plan.save) saved += s;
    for (bool s : st.plan.skip) skipped += s;
    d.insert("profiles", st.profiles);
    d.insert("replans", st.replans);
    d.insert("profiled_ops", static_cast<int64_t>(st.profile.size()));
    d.insert("budget_bytes", st.plan.budget_bytes);
    d.insert("kept_bytes", st.plan.kept_bytes);
    d.insert("total_bytes", st.plan.total_bytes);
    d.insert("off_bytes", st.plan.off_bytes);
    d.insert("groups", st.plan.groups);
    d.insert("kept_groups", st.plan.kept_groups);
    d.insert("planned_ops", static_cast<int64_t>(st.plan.save.size()));
    d.insert("saved_ops", saved);
    d.insert("skipped_ops", skipped);
    return d;
  }

  // [kernel µs the plan's saves avoid recomputing, kernel µs of every profiled op, kernel µs of the ops the
  // recompute skips, the recompute's predicted µs (Note [The recompute's fixed cost]; -1 without dataflow)]
  std::vector<double> micros() const {
    const BudgetRegion::Status st = region_->status();
    return {st.plan.saved_micros, st.plan.total_micros, st.plan.skipped_micros, st.plan.recompute_micros};
  }

 private:
  std::shared_ptr<BudgetRegion> region_;
};

// A whole-step memory target seen from Python: policy/step_driver.h, whose calls plugin/python/hpac/_target.py's
// hooks make with its meter's numbers. Layers are added one by one (add_layer: a name and its BudgetRegion), then
// the first call makes the driver.
class StepDriverHandle : public torch::CustomClassHolder {
 public:
  using Messages = std::vector<std::tuple<bool, std::string>>;  // (warning, text) per message

  // measure_only: the events and history without a plan (target_bytes is then ignored).
  StepDriverHandle(int64_t target_bytes, int64_t params_bytes, int64_t grads_bytes, bool measure_only)
      : target_bytes_(measure_only ? std::numeric_limits<int64_t>::max() / 4 : target_bytes),
        params_bytes_(params_bytes), grads_bytes_(grads_bytes), measure_only_(measure_only) {
    TORCH_CHECK(target_bytes_ > 0, "hpac memory target: ", target_bytes, " bytes; allowed: > 0");
  }
  void addLayer(const std::string& name, const c10::intrusive_ptr<BudgetRegionHandle>& region) {
    TORCH_CHECK(!driver_, "hpac memory target: add_layer after the target started");
    names_.push_back(name);
    regions_.push_back(region->region());
  }

  Messages stepBegins(int64_t peak, int64_t live, int64_t fragmentation) {
    return messages(d().stepBegins(peak, live, fragmentation));
  }
  Messages beforeLayers(int64_t peak) { return messages(d().beforeLayers(peak)); }
  void forwardBegins(int64_t i, int64_t peak) { d().forwardBegins(i, peak); }
  void forwardEnds(int64_t i, int64_t peak) { d().forwardEnds(i, peak); }
  void backwardBegins(int64_t i, int64_t peak) { d().backwardBegins(i, peak); }
  void restBegins(int64_t peak) { d().restBegins(peak); }
  void optimizerBegins(int64_t peak, int64_t live) { d().optimizerBegins(peak, live); }
  Messages stepEnds(int64_t peak, int64_t fragmentation, int64_t live) {
    return messages(d().stepEnds(peak, fragmentation, live));
  }
  void watchOptimizer() { d().watchOptimizer(); }
  void seed(const std::string& record_json, const std::string& source) { d().seed(record_json, source); }
  std::string state() { return d().state(); }
  void merge(const std::vector<std::string>& states) { d().merge(states); }
  // (kind token, layer) of the event open now (policy/step_target.h's StepEventKind); ("", -1) when none.
  std::tuple<std::string, int64_t> openEvent() {
    const auto& e = d().openEvent();
    if (!e) return {"", -1};
    return {stepEventKindToken(e->kind), e->index};
  }
  bool checkpointed(int64_t i) { return d().checkpointed(i); }
  std::string error() { return d().error(); }
  int64_t plannedAt() { return d().target().plannedAt(); }
  std::string reportJson() { return d().target().reportJson(); }
  // Per uniform plan k (StepTarget::uniformPlans): (predicted peak, µs, layer 0's budget bytes).
  std::vector<std::tuple<int64_t, double, int64_t>> uniformPlans() {
    std::vector<std::tuple<int64_t, double, int64_t>> out;
    const auto& candidates = d().target().candidates();
    for (const auto& [peak, micros] : d().target().uniformPlans()) {
      out.emplace_back(peak, micros, candidates.at(0).at(out.size()).budget_bytes);
    }
    return out;
  }

 private:
  StepDriver& d() {
    if (!driver_) {
      driver_ = std::make_unique<StepDriver>(
          std::make_unique<StepTarget>(target_bytes_, names_, regions_, params_bytes_, grads_bytes_), measure_only_);
    }
    return *driver_;
  }
  static Messages messages(const std::vector<StepMessage>& in) {
    Messages out;
    for (const StepMessage& m : in) out.emplace_back(m.warning, m.text);
    return out;
  }
  const int64_t target_bytes_, params_bytes_, grads_bytes_;
  const bool measure_only_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<BudgetRegion>> regions_;
  std::unique_ptr<StepDriver> driver_;
};

// One checkpoint region that torch.compile traces (hpac's compiled path,
// plugin/python/hpac/_compile.py): the policy's answer per traced op, as the
// int of torch.utils.checkpoint.CheckpointPolicy (the same order as hpac's).
class TracedPolicyHandle : public torch::CustomClassHolder {
 public:
  TracedPolicyHandle(const std::string& kind, const std::vector<std::string>& save_list, bool save_routing,
                     bool record_log)
      : traced_(policyForKind(parsePolicyKind(kind, "hpac.TracedPolicy"), save_list, "hpac.TracedPolicy"),
                save_routing, record_log) {}

  // name "ns::op", overload "" for the default overload.
  int64_t decide(const std::string& name, const std::string& overload) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    const CheckpointPolicy answer =
        op ? traced_.decide(*op) : traced_.decideUnregistered(qualifiedOpName(c10::OperatorName(name, overload)));
    return static_cast<int64_t>(answer);
  }
  std::vector<std::string> log() const { return traced_.log(); }
  c10::Dict<std::string, int64_t> stats() const {
    c10::Dict<std::string, int64_t> d;
    d.insert("counted", traced_.counted());
    d.insert("ignored", traced_.ignored());
    d.insert("saved", traced_.saved());
    return d;
  }

 private:
  TracedPolicy traced_;
};

// Explain from Python (hpac.explain): the report is assembled and rendered by
// the same C++ as hpac-explain's (replay/explain.h).
class ExplainHandle : public torch::CustomClassHolder {
 public:
  ExplainHandle(const std::string& source, const std::string& region, const std::string& mode) {
    report_.source = source;
    report_.region = region;
    report_.mode = mode;
  }
  void setInvocation(const c10::intrusive_ptr<InvocationHandle>& handle) {
    const Invocation& inv = handle->invocation();
    TORCH_CHECK(inv.recorder() != nullptr, "hpac.explain: invocation ", inv.id(), " was not created with explain on");
    report_.ops = inv.recorder()->ops();
    report_.stats = inv.stats();
  }
  void captureBegin() {
    TORCH_CHECK(!capture_, "hpac.explain: a timeline capture is already running");
    capture_ = std::make_unique<TimelineCapture>();
  }
  void mark(const std::string& label) {
    TORCH_CHECK(capture_, "hpac.explain: mark('", label, "') outside a timeline capture");
    capture_->mark(label);
  }
  void captureEnd(const std::string& mode) {
    TORCH_CHECK(capture_, "hpac.explain: capture_end('", mode, "') without capture_begin()");
    report_.timelines.push_back(capture_->finish(mode));
    capture_.reset();
  }
  std::string text(int64_t rows) const { return formatExplainTable(report_, static_cast<size_t>(std::max<int64_t>(rows, 0))); }
  std::string json() const { return explainJson(report_); }
  std::string svg() const { return timelineSvg(report_.timelines, "hpac explain: " + report_.source); }
  void write(const std::string& path, const std::string& what) const {
    TORCH_CHECK(what == "json" || what == "svg", "hpac.explain: unknown file kind '", what, "'; allowed: json, svg");
    writeTextFile(path, what == "json" ? json() : svg(), what == "json" ? "JSON" : "SVG");
  }

 private:
  ExplainReport report_;
  std::unique_ptr<TimelineCapture> capture_;
};

// What this libhpac is and where its fallback stands; the process-wide invocation statistics.
std::vector<std::map<c10::DeviceType, Roofline>>& savedRooflines() {
  static std::vector<std::map<c10::DeviceType, Roofline>> saved;
  return saved;
}

void registerLibraryOps(torch::Library& m) {
  m.def("version() -> str", [] { return std::string(version()); });
  m.def("library_path() -> str", [] { return libraryPath(); });
  m.def("built_for_torch() -> str", [] { return std::string(builtForTorch()); });
  m.def("dispatch_key() -> str", [] { return std::string(c10::toString(dispatchKey())); });
  m.def("fallback_status() -> str", [] {
    const FallbackStatus s = fallbackStatus();
    return s.registered ? std::string("registered") : "not registered: " + s.reason;
  });
  m.def("global_stats() -> Dict(str, int)", [] { return toDict(globalStats()); });
  m.def("reset_global_stats() -> ()", [] { resetGlobalStats(); });
  // Note [One size grammar] (policy/byte_size.h): the memory target's size and the one byte formatter.
  m.def("parse_memory_target(str text) -> int", [](const std::string& text) {
    std::string error;
    const int64_t bytes = parseMemoryTarget(text, &error);
    TORCH_CHECK(bytes > 0, error);
    return bytes;
  });
  m.def("format_bytes(int bytes) -> str", [](int64_t bytes) { return formatBytes(bytes); });
  // Note [The step record's format] (policy/step_record.h): a plan file read (version 1 converted) and written in
  // version 2, or refused naming `source`, the key and what is allowed.
  m.def("read_step_record(str text, str source) -> str", [](const std::string& text, const std::string& source) {
    return stepRecordJson(readStepRecord(text, source));
  });
}

struct StepProblem {
  std::vector<std::vector<StepChoice>> layers;
  std::vector<StepEvent> events;
};

StepProblem stepProblem(const std::vector<int64_t>& counts, const std::vector<int64_t>& kept,
                        const std::vector<int64_t>& backward, const std::vector<double>& micros,
                        const std::vector<int64_t>& forward, const std::vector<int64_t>& event_base,
                        const std::vector<int64_t>& event_kept, const std::vector<int64_t>& event_layer) {
  TORCH_CHECK(kept.size() == backward.size() && kept.size() == micros.size() && kept.size() == forward.size(),
              "hpac.plan_step: ", kept.size(), " kept sizes, ", backward.size(), " backward sizes, ", micros.size(),
              " times and ", forward.size(), " forward sizes; allowed: as many");
  TORCH_CHECK(event_base.size() == event_kept.size() && event_base.size() == event_layer.size(), "hpac.plan_step: ",
              event_base.size(), " event bases, ", event_kept.size(), " kept counts and ", event_layer.size(),
              " layers; allowed: as many");
  StepProblem p;
  size_t next = 0;
  for (int64_t n : counts) {
    TORCH_CHECK(n >= 0 && next + n <= kept.size(), "hpac.plan_step: counts ask for more candidates than the ",
                kept.size(), " given");
    p.layers.emplace_back();
    for (int64_t k = 0; k < n; ++k, ++next) {
      p.layers.back().push_back(StepChoice{kept[next], backward[next], micros[next], forward[next]});
    }
  }
  TORCH_CHECK(next == kept.size(), "hpac.plan_step: counts cover ", next, " of the ", kept.size(), " candidates");
  for (size_t e = 0; e < event_base.size(); ++e) {
    p.events.push_back(stepEvent(event_base[e], event_kept[e], event_layer[e]));
  }
  return p;
}

// The planner's ops, one kernel each (registered by registerPlannerOps below).

// Note [Estimated op costs]: the roofline a device type's estimates use (measured on first use, or pinned).
std::vector<double> rooflineOp(const std::string& device) {
  const Roofline& r = deviceRoofline(c10::Device(device));
  return std::vector<double>{r.flops_per_us, r.bytes_per_us};
}

#if HPAC_TORCH_AT_LEAST(2, 5)
// What sdp_choice asks about in place of a query, key or value: zeros of its shape with batch 1 and four positions.
at::Tensor sdpStandIn(std::vector<int64_t> shape, c10::ScalarType dtype) {
  TORCH_CHECK(shape.size() >= 2, "hpac.sdp_choice: a query, key or value of ", shape.size(), " dims");
  shape[0] = 1;
  shape[shape.size() - 2] = 4;
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}

// ... and in place of a mask of `dims` dims: zeros of size 1 in each, but four positions by four in the last two.
at::Tensor sdpMaskStandIn(size_t dims, c10::ScalarType dtype) {
  std::vector<int64_t> shape(dims, 1);
  if (shape.size() >= 2) shape[shape.size() - 1] = shape[shape.size() - 2] = 4;
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}
#endif

// Note [Attention on meta as on CPU] (plugin/python/hpac/_plan.py): the kernel CPU's scaled_dot_product_attention
// picks for these shapes and flags, asked with stand-ins of four positions outside any region (hpac's key hidden;
// an ignored op of the region, policy/op_tables.cpp). -1 before torch 2.5 (no enable_gqa).
int64_t sdpChoiceOp(std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v, c10::ScalarType dtype,
                    c10::optional<std::vector<int64_t>> mask, c10::optional<c10::ScalarType> mask_dtype,
                    double dropout_p, bool is_causal, c10::optional<double> scale,
                    bool enable_gqa) {  // c10::optional: torch 1.13
#if HPAC_TORCH_AT_LEAST(2, 5)
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  std::optional<at::Tensor> m_in;
  if (mask) m_in = sdpMaskStandIn(mask->size(), mask_dtype.value_or(dtype));
  return at::_fused_sdp_choice(sdpStandIn(q, dtype), sdpStandIn(k, dtype), sdpStandIn(v, dtype), m_in, dropout_p,
                               is_causal, scale, enable_gqa);
#else
  return -1;
#endif
}

// The scalar type c10 names `name` ("Float", "BFloat16", "Half", ...), or none.
c10::optional<c10::ScalarType> scalarTypeNamed(const std::string& name) {
  for (int k = 0; k < static_cast<int>(c10::ScalarType::NumOptions); ++k) {
    const auto type = static_cast<c10::ScalarType>(k);
    if (name == c10::toString(type)) return type;
  }
  return c10::nullopt;
}

// Note [A device that is not here]: a device spec's rates for a device type (hpac.plan sets the meta device's);
// dtypes by c10's names ("BFloat16", "Float", "Half", ...).
void setRooflineOp(const std::string& device, double flops, double bytes, const std::vector<std::string>& dtypes,
                   const std::vector<double>& dtype_flops) {
  TORCH_CHECK(dtypes.size() == dtype_flops.size(), "hpac.set_roofline: ", dtypes.size(), " dtypes but ",
              dtype_flops.size(), " rates");
  Roofline r;
  r.flops_per_us = flops;
  r.bytes_per_us = bytes;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const c10::optional<c10::ScalarType> type = scalarTypeNamed(dtypes[i]);
    TORCH_CHECK(type.has_value(), "hpac.set_roofline: dtype '", dtypes[i], "' is not one of c10's scalar types "
                "(allowed: 'Float', 'BFloat16', 'Half', ...)");
    r.flops_per_us_by_dtype[*type] = dtype_flops[i];
  }
  setRoofline(c10::Device(device).type(), std::move(r));
}

// A profile given to plan_budget as lists: per op its storages (storage_counts[i] of the flat (id, bytes) lists),
// µs, view and collective flags (0/1).
std::vector<ProfiledOp> profiledOps(const std::vector<int64_t>& counts, const std::vector<int64_t>& ids,
                                    const std::vector<int64_t>& bytes, const std::vector<double>& micros,
                                    const std::vector<int64_t>& view, const std::vector<int64_t>& collective) {
  const size_t n = counts.size();
  TORCH_CHECK(micros.size() == n && view.size() == n && collective.size() == n && ids.size() == bytes.size(),
              "hpac.plan_budget: ", n, " ops but ", micros.size(), " micros, ", view.size(), " view and ",
              collective.size(), " collective flags; ", ids.size(), " storage ids but ", bytes.size(), " sizes");
  std::vector<ProfiledOp> ops(n);
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(counts[i] >= 0 && next + counts[i] <= ids.size(), "hpac.plan_budget: storage_counts ask for ",
                "more storages than the ", ids.size(), " given");
    for (int64_t k = 0; k < counts[i]; ++k, ++next) ops[i].storages.emplace_back(ids[next], bytes[next]);
    ops[i].micros = micros[i];
    ops[i].view = view[i] != 0;
    ops[i].collective = collective[i] != 0;
  }
  return ops;
}

// Note [An exact oracle for the planner]: the additive planner (no dataflow) on a profile given as lists
// (profiledOps). Returns the plan's save flags per op and the groups (as BudgetRegion.groups), for tests and
// benchmarks.
auto planBudgetOp(const std::vector<int64_t>& counts, const std::vector<int64_t>& ids,
                  const std::vector<int64_t>& bytes, const std::vector<double>& micros,
                  const std::vector<int64_t>& view, const std::vector<int64_t>& collective, int64_t budget_bytes) {
  const std::vector<ProfiledOp> ops = profiledOps(counts, ids, bytes, micros, view, collective);
  const BudgetPlan plan = planBudget(ops, budget_bytes);
  const auto [group_of, group_bytes, group_micros, group_collective] =
      BudgetRegionHandle::groupsTuple(planGroups(ops));
  return std::make_tuple(std::vector<int64_t>(plan.save.begin(), plan.save.end()), group_of, group_bytes,
                         group_micros, group_collective);
}

// Note [An exact step plan] (policy/step_plan.h): the whole-step planner on candidates given as flat lists (layer j
// has counts[j] of them, in order) and events (base bytes, layers kept, own layer or -1, as stepEvent() reads
// them). Returns (choice per layer, predicted peak, the event setting it, summed µs, fits, exact, largest front).
auto planStepOp(const std::vector<int64_t>& counts, const std::vector<int64_t>& kept,
                const std::vector<int64_t>& backward, const std::vector<double>& micros,
                const std::vector<int64_t>& forward, const std::vector<int64_t>& event_base,
                const std::vector<int64_t>& event_kept, const std::vector<int64_t>& event_layer,
                int64_t target_bytes) {
  const StepProblem p = stepProblem(counts, kept, backward, micros, forward, event_base, event_kept, event_layer);
  const StepPlan plan = planStep(p.layers, p.events, target_bytes);
  return std::make_tuple(plan.choice, plan.peak_bytes, plan.peak_event, plan.recompute_micros, plan.fits, plan.exact,
                         plan.front_states);
}

// The budget's cost model and planner: a device's roofline (the front ends measure it before a region, hpac.plan
// pins a device spec's), the attention kernel CPU picks (hpac.plan's meta steps), and the additive and whole-step
// planners as oracles (tests and benchmarks).
void registerPlannerOps(torch::Library& m) {
  m.def("roofline(str device) -> float[]", &rooflineOp);
  m.def("sdp_choice(int[] q, int[] k, int[] v, ScalarType dtype, int[]? mask, ScalarType? mask_dtype, "
        "float dropout_p, bool is_causal, float? scale, bool enable_gqa) -> int",
        &sdpChoiceOp);
  m.def("set_roofline(str device, float flops_per_us, float bytes_per_us, str[] dtypes, float[] dtype_flops_per_us) "
        "-> ()",
        &setRooflineOp);
  m.def("plan_budget(int[] storage_counts, int[] storage_ids, int[] storage_bytes, float[] micros, int[] view, "
        "int[] collective, int budget_bytes) -> (int[], int[], int[], float[], int[])",
        &planBudgetOp);
  m.def("plan_step(int[] counts, int[] kept, int[] backward, float[] micros, int[] forward, int[] event_base, "
        "int[] event_kept, int[] event_layer, int target_bytes) -> (int[], int, int, float, bool, bool, int)",
        &planStepOp);
}

// What hpac.plan changes for its meta steps and puts back (plugin/python/hpac/plan.py, _process_kept_as_found): the
// rooflines, saved by number (each save is restored once, in reverse order).
void registerPlanScopeOps(torch::Library& m) {
  m.def("save_rooflines() -> int", [] {
    savedRooflines().push_back(rooflinesNow());
    return static_cast<int64_t>(savedRooflines().size());
  });
  m.def("restore_rooflines(int saved) -> ()", [](int64_t saved) {
    auto& all = savedRooflines();
    TORCH_CHECK(saved >= 1 && saved == static_cast<int64_t>(all.size()), "hpac.restore_rooflines(", saved, "): ",
                all.size(), " saved; allowed: the last save_rooflines() not yet restored");
    restoreRooflines(std::move(all.back()));
    all.pop_back();
  });
}

// Measurements: tensor memory of CPU tensors, and the fallback's entries on this thread.
void registerMeasurementOps(torch::Library& m) {
  // Tensor-memory accounting for CPU tensors (the tracking allocator wraps the
  // current CPU allocator once; tensors allocated before are not counted).
  m.def("track_memory() -> ()", [] { TrackingAllocator::install(); });
  m.def("memory_stats() -> Dict(str, int)", [] {
    TrackingAllocator& t = TrackingAllocator::instance();  // reads; installs nothing
    c10::Dict<std::string, int64_t> d;
    d.insert("current_bytes", t.currentBytes());
    d.insert("peak_bytes", t.peakBytes());
    d.insert("allocations", t.allocations());
    return d;
  });
  m.def("reset_peak_memory() -> ()", [] { TrackingAllocator::instance().resetPeak(); });
  // The memory target's own peak since its last take (TrackingAllocator::takeEventPeak; reset_peak_memory leaves it).
  m.def("take_event_peak() -> int", [] { return TrackingAllocator::instance().takeEventPeak(); });
  m.def("memory_tracked() -> bool", [] { return TrackingAllocator::installed(); });
  // Note [Meta tensors are counted]: meta tensors' bytes count in the same counters, for the rest of the process.
  m.def("track_meta_memory(bool on=True) -> bool", [](bool on) { return TrackingAllocator::trackMeta(on); });
  // Note [Meta ops are not the region's] (plugin/fallback.cpp): hpac.plan's step on the meta device counts them.
  m.def("meta_ops_in_regions(bool on) -> bool", [](bool on) { return setMetaOpsInRegions(on); });
  m.def("meta_memory_tracked() -> bool", [] { return TrackingAllocator::metaTracked(); });
  // hpac::Invocation objects alive (C++ and Python regions alike): 0 when no autograd graph holds one.
  m.def("invocations_alive() -> int", [] { return Invocation::alive(); });
  m.def("fallback_entries() -> int", [] { return static_cast<int64_t>(fallbackEntriesOnThisThread()); });
}

// The custom classes: a checkpoint call, a budget region, a compiled region's policy, explain.
void registerClasses(torch::Library& m) {
  m.class_<InvocationHandle>("Invocation")
      .def(torch::init<std::string, std::vector<std::string>, bool, std::string, std::string, bool>())
      .def("id", &InvocationHandle::id)
      .def("address", &InvocationHandle::address)
      .def("enter", &InvocationHandle::enter)
      .def("exit", &InvocationHandle::exit)
      .def("stats", &InvocationHandle::stats)
      .def("stored_entries", &InvocationHandle::storedEntries)
      .def("record_ops", &InvocationHandle::recordOps)
      .def("watches_saved", &InvocationHandle::watchesSaved)
      .def("note_saved", &InvocationHandle::noteSaved)
      .def("hold_saved", &InvocationHandle::holdSaved)
      .def("release_kept", &InvocationHandle::releaseKept)
      .def("respect_saved_tensors_hooks", &InvocationHandle::respectSavedTensorsHooks)
      .def("kept_released", &InvocationHandle::keptReleased)
      .def("name_state", &InvocationHandle::nameState)
      .def("op_log", &InvocationHandle::opLog)
      .def("explain", &InvocationHandle::explain);

  m.class_<BudgetRegionHandle>("BudgetRegion")
      .def(torch::init<c10::optional<double>, c10::optional<int64_t>, int64_t, int64_t, bool,
                       c10::optional<std::string>, std::string, std::string>())
      .def("invocation", &BudgetRegionHandle::invocation)
      .def("profile", &BudgetRegionHandle::profile)
      .def("stage", &BudgetRegionHandle::stage)
      .def("status", &BudgetRegionHandle::status)
      .def("micros", &BudgetRegionHandle::micros)
      .def("plan_text", &BudgetRegionHandle::planText)
      .def("plan_source", &BudgetRegionHandle::planSource)
      .def("groups", &BudgetRegionHandle::groups)
      .def("plan_text_keeping", &BudgetRegionHandle::planTextKeeping)
      .def("candidates", &BudgetRegionHandle::candidates)
      .def("forward_bytes", &BudgetRegionHandle::forwardBytes)
      .def("replan", &BudgetRegionHandle::replan);
  m.class_<StepDriverHandle>("StepDriver")
      .def(torch::init<int64_t, int64_t, int64_t, bool>())
      .def("add_layer", &StepDriverHandle::addLayer)
      .def("step_begins", &StepDriverHandle::stepBegins)
      .def("before_layers", &StepDriverHandle::beforeLayers)
      .def("forward_begins", &StepDriverHandle::forwardBegins)
      .def("forward_ends", &StepDriverHandle::forwardEnds)
      .def("backward_begins", &StepDriverHandle::backwardBegins)
      .def("rest_begins", &StepDriverHandle::restBegins)
      .def("optimizer_begins", &StepDriverHandle::optimizerBegins)
      .def("step_ends", &StepDriverHandle::stepEnds)
      .def("watch_optimizer", &StepDriverHandle::watchOptimizer)
      .def("seed", &StepDriverHandle::seed)
      .def("state", &StepDriverHandle::state)
      .def("merge", &StepDriverHandle::merge)
      .def("open_event", &StepDriverHandle::openEvent)
      .def("checkpointed", &StepDriverHandle::checkpointed)
      .def("error", &StepDriverHandle::error)
      .def("planned_at", &StepDriverHandle::plannedAt)
      .def("report_json", &StepDriverHandle::reportJson)
      .def("uniform_plans", &StepDriverHandle::uniformPlans);
  m.class_<TracedPolicyHandle>("TracedPolicy")
      .def(torch::init<std::string, std::vector<std::string>, bool, bool>())
      .def("decide", &TracedPolicyHandle::decide)
      .def("log", &TracedPolicyHandle::log)
      .def("stats", &TracedPolicyHandle::stats);

  m.class_<ExplainHandle>("Explain")
      .def(torch::init<std::string, std::string, std::string>())
      .def("set_invocation", &ExplainHandle::setInvocation)
      .def("capture_begin", &ExplainHandle::captureBegin)
      .def("mark", &ExplainHandle::mark)
      .def("capture_end", &ExplainHandle::captureEnd)
      .def("text", &ExplainHandle::text)
      .def("json", &ExplainHandle::json)
      .def("svg", &ExplainHandle::svg)
      .def("write", &ExplainHandle::write);
}

}  // namespace

// In this order: the schemas and classes of ops.h.
void registerHpacOps(torch::Library& m) {
  registerLibraryOps(m);
  registerPlannerOps(m);
  registerMeasurementOps(m);
  registerPlanScopeOps(m);
  registerClasses(m);
}

}  // namespace hpac
