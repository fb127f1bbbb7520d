#include "policy/op_tables.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace hpac {
namespace {

constexpr bool kRequired = false;
constexpr bool kOptional = true;

// Ignored entirely: no count, no policy, no cache. detach and prim::device do
// not compute; the profiler ops appear only when record_function ranges are
// active; the FSDP lifecycle ops appear only for some ranks/steps (parameter
// gathers, re-gathers in backward), and counting them would shift every later
// occurrence index (the torchtitan#3427 failure mode).
constexpr OpEntry kIgnoredOps[] = {
    {"aten::_chunk_cat", kOptional},
    {"aten::copy_.default", kRequired},
    {"aten::detach", kRequired},
    {"aten::empty.memory_format", kRequired},
    {"aten::empty_like", kRequired},
    {"aten::split_with_sizes_copy", kOptional},
    {"aten::view.default", kRequired},
    {"c10d::_allgather_base_", kOptional},
    {"fsdp::all_gather_copy_in", kOptional},
    {"fsdp::chunk_cat", kOptional},
    {"fsdp::split_with_sizes_copy", kOptional},
    {"hpac::sdp_choice", kOptional},  // hpac.plan's (Note [Attention on meta as on CPU]): not the model's
    {"prim::device", kOptional},
    {"profiler::_record_function_enter", kOptional},
    {"profiler::_record_function_enter_new", kOptional},
    {"profiler::_record_function_exit", kOptional},
};

// Always recomputed: Qwen-style routers divide the topk values in place, so a
// saved reference would be mutated after it was cached.
constexpr OpEntry kRecomputeOps[] = {
    {"aten::topk", kRequired},
};

// The matmul family: 1st, 3rd, 5th... call per invocation and phase saved.
constexpr OpEntry kMatmulOps[] = {
    {"aten::_grouped_mm", kOptional},
    {"aten::_scaled_grouped_mm", kOptional},
    {"aten::linear", kRequired},
    {"aten::matmul", kRequired},
    {"aten::mm", kRequired},
};

// Saved: compute-intensive ops, attention kernels, max, collectives (a
// functional collective's wait_tensor with it: the recompute is served the
// completed tensor and waits on nothing). The
// point-to-point pair c10d::send / c10d::recv_ (an all-to-all on backends
// without one, tools/distributed) must be saved together: a recompute that re-sent
// while its peer was served would leave a message nobody receives.
//
// Every _c10d_functional collective of torch 2.x is here, not only the three
// the reference design names: its wait_tensor is saved, so a collective left
// to the recompute (DTensor's Shard -> Replicate all-gather, a coalesced
// all-reduce) would be issued again and never waited (the served wait_tensor
// skips it), and it would be issued only by ranks that recompute.
constexpr OpEntry kSaveOps[] = {
    {"_c10d_functional::all_gather_into_tensor", kOptional},
    {"_c10d_functional::all_gather_into_tensor_coalesced", kOptional},
    {"_c10d_functional::all_reduce", kOptional},
    {"_c10d_functional::all_reduce_coalesced", kOptional},
    {"_c10d_functional::all_to_all_single", kOptional},
    {"_c10d_functional::reduce_scatter_tensor", kOptional},
    {"_c10d_functional::reduce_scatter_tensor_coalesced", kOptional},
    {"_c10d_functional::wait_tensor", kOptional},
    {"aten::_convolution", kRequired},
    {"aten::_efficient_attention_forward", kOptional},
    {"aten::_flash_attention_forward", kOptional},
    {"aten::_flash_scaled_dot_product_attention", kOptional},
    {"aten::_scaled_dot_product_attention_math", kOptional},
    {"aten::_scaled_dot_product_cudnn_attention", kOptional},
    {"aten::_scaled_dot_product_efficient_attention", kOptional},
    {"aten::_scaled_dot_product_flash_attention", kOptional},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", kOptional},
    {"aten::_scaled_mm", kOptional},
    {"aten::addmm", kRequired},
    {"aten::baddbmm", kRequired},
    {"aten::bmm", kRequired},
    {"aten::convolution", kRequired},
    {"aten::cudnn_convolution", kOptional},
    {"aten::max", kRequired},
    {"aten::mkldnn_convolution", kOptional},
    {"c10d::allreduce_", kOptional},
    {"c10d::alltoall_", kOptional},
    {"c10d::alltoall_base_", kOptional},
    {"c10d::recv_", kOptional},
    {"c10d::reduce_scatter_", kOptional},
    {"c10d::reduce_scatter_tensor_coalesced_", kOptional},
    {"c10d::send", kOptional},
    {"npu::npu_fusion_attention", kOptional},
};

// Outputs alias an input's storage without sharing its version counter.
constexpr OpEntry kUnsafeAliasOps[] = {
    {"aten::_unsafe_view", kRequired},
    {"aten::unsafe_chunk", kRequired},
    {"aten::unsafe_split", kRequired},
    {"aten::unsafe_split_with_sizes", kRequired},
};

// Routing: ops whose outputs decide where tokens go (which experts, how many
// rows each) — Note [Routing is verified] (replay/routing_check.h). Their
// integer returns are compared between forward and recompute when the
// policy recomputes them, or they are saved (RoutingRule::kSave).
constexpr OpEntry kRoutingOps[] = {
    {"aten::_unique2", kRequired},
    {"aten::argmax", kRequired},
    {"aten::argsort", kRequired},
    {"aten::bincount", kRequired},
    {"aten::histc", kRequired},
    {"aten::kthvalue", kRequired},
    {"aten::nonzero", kRequired},
    {"aten::repeat_interleave.Tensor", kRequired},
    {"aten::sort", kRequired},
    {"aten::topk", kRequired},
    {"aten::unique_consecutive", kRequired},
    {"aten::unique_dim", kRequired},
};

// torchtitan 0.3.0's SelectiveAC save set (torchtitan/distributed/activation_checkpoint.py,
// _get_default_save_ops; `pip download --no-deps torchtitan==0.3.0`), every entry one overload as torchtitan names
// it:
// - torch._functorch.partitioners.get_default_op_list().compute_intensive_ops of torch 2.13, each `.default`:
//   _efficient_attention_forward, _flash_attention_forward, _scaled_dot_product_efficient_attention,
//   _scaled_dot_product_flash_attention, _scaled_mm, addmm, bmm, convolution, convolution_backward, mm,
//   upsample_bilinear2d (not _scaled_dot_product_flash_attention_for_cpu: CPU SDPA is recomputed);
// - its compute_ops: _scaled_dot_product_cudnn_attention, _scaled_dot_product_attention_math,
//   _scaled_dot_product_fused_attention_overrideable, max, linear, topk, torch_attn::_varlen_attn (where
//   registered); flex_attention and inductor_compiled_code are higher-order operators, which eager hpac never sees;
// - its comm_ops: _c10d_functional reduce_scatter_tensor and all_to_all_single, DeepEP / HybridEP dispatch and
//   combine (where registered).
// Optional: what torch 1.13 lacks, and what only extensions register.
constexpr OpEntry kTorchtitanSaveOps[] = {
    {"_c10d_functional::all_to_all_single.default", kOptional},
    {"_c10d_functional::reduce_scatter_tensor.default", kOptional},
    {"aten::_efficient_attention_forward.default", kOptional},
    {"aten::_flash_attention_forward.default", kOptional},
    {"aten::_scaled_dot_product_attention_math.default", kOptional},
    {"aten::_scaled_dot_product_cudnn_attention.default", kOptional},
    {"aten::_scaled_dot_product_efficient_attention.default", kOptional},
    {"aten::_scaled_dot_product_flash_attention.default", kOptional},
    {"aten::_scaled_dot_product_fused_attention_overrideable.default", kOptional},
    {"aten::_scaled_mm.default", kOptional},
    {"aten::addmm.default", kRequired},
    {"aten::bmm.default", kRequired},
    {"aten::convolution.default", kRequired},
    {"aten::convolution_backward.default", kRequired},
    {"aten::linear.default", kRequired},
    {"aten::max.default", kRequired},
    {"aten::mm.default", kRequired},
    {"aten::topk.default", kRequired},
    {"aten::upsample_bilinear2d.default", kRequired},
    {"deepep::combine.default", kOptional},
    {"deepep::dispatch.default", kOptional},
    {"hybridep::combine.default", kOptional},
    {"hybridep::dispatch.default", kOptional},
    {"torch_attn::_varlen_attn.default", kOptional},
};

// torchtitan's mm_ops: counted for "every second matmul", and matched against the force-recompute shapes.
constexpr OpEntry kTorchtitanMatmulOps[] = {
    {"aten::linear.default", kRequired},
    {"aten::mm.default", kRequired},
};

// Splits "ns::op[.overload]" into (op, overload, every_overload).
struct ParsedEntry {
  std::string name;
  std::string overload;
  bool every_overload;
};

// The entry as a message shows it: printable ASCII as is, any other byte as \xNN.
std::string printable(const std::string& entry) {
  std::string out;
  for (const unsigned char c : entry) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

ParsedEntry parseEntry(const std::string& entry) {
  // Found by fuzzing (test/fuzz/op_name_fuzzer.cpp): a NUL inside an entry cut the
  // refusal's message short, so it no longer named the entry.
  TORCH_CHECK(std::all_of(entry.begin(), entry.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; }),
              "hpac: op table entry '", printable(entry),
              "' holds a byte that is not printable ASCII (shown as \\xNN); entries are 'namespace::op' or "
              "'namespace::op.overload' (for example 'aten::mm' or 'aten::max.dim')");
  const auto sep = entry.find("::");
  TORCH_CHECK(sep != std::string::npos && sep > 0 && sep + 2 < entry.size(),
              "hpac: op table entry '", entry,
              "' is not of the form 'namespace::op' or 'namespace::op.overload' "
              "(for example 'aten::mm' or 'aten::max.dim')");
  const auto dot = entry.find('.', sep + 2);
  if (dot == std::string::npos) {
    return {entry, "", true};
  }
  TORCH_CHECK(dot + 1 < entry.size(), "hpac: op table entry '", entry,
              "' ends with '.'; name an overload ('aten::copy_.default' is the overload with the empty name)");
  std::string overload = entry.substr(dot + 1);
  if (overload == "default") overload.clear();
  return {entry.substr(0, dot), std::move(overload), false};
}

}  // namespace

const char* toString(OpCategory c) {
  switch (c) {
    case OpCategory::kOther: return "other";
    case OpCategory::kIgnored: return "ignored";
    case OpCategory::kRecompute: return "recompute";
    case OpCategory::kMatmul: return "matmul";
    case OpCategory::kSave: return "save";
  }
  return "?";
}

c10::ArrayRef<OpEntry> ignoredOps() { return kIgnoredOps; }
c10::ArrayRef<OpEntry> recomputeOps() { return kRecomputeOps; }
c10::ArrayRef<OpEntry> matmulOps() { return kMatmulOps; }
c10::ArrayRef<OpEntry> saveOps() { return kSaveOps; }
c10::ArrayRef<OpEntry> unsafeAliasOps() { return kUnsafeAliasOps; }
c10::ArrayRef<OpEntry> routingOps() { return kRoutingOps; }
c10::ArrayRef<OpEntry> torchtitanSaveOps() { return kTorchtitanSaveOps; }
c10::ArrayRef<OpEntry> torchtitanMatmulOps() { return kTorchtitanMatmulOps; }

std::vector<c10::OperatorHandle> resolveEntry(const std::string& entry) {
  const ParsedEntry parsed = parseEntry(entry);
  auto& dispatcher = c10::Dispatcher::singleton();
  std::vector<c10::OperatorHandle> handles;
  if (!parsed.every_overload) {
    if (auto h = dispatcher.findSchema({parsed.name, parsed.overload})) handles.push_back(*h);
    return handles;
  }
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name != parsed.name) continue;
    if (auto h = dispatcher.findSchema(name)) handles.push_back(*h);
  }
  return handles;
}

ResolvedOpTables::ResolvedOpTables() {
  // Later tables do not override earlier ones: an op listed twice keeps its
  // first category, in the order of the selective policy's rules.
  add(kIgnoredOps, OpCategory::kIgnored);
  add(kRecomputeOps, OpCategory::kRecompute);
  add(kMatmulOps, OpCategory::kMatmul);
  add(kSaveOps, OpCategory::kSave);
  addSet(kUnsafeAliasOps, "unsafe-alias", unsafe_alias_);
  addSet(kRoutingOps, "routing", routing_);
  for (const OpEntry& entry : kIgnoredOps) {
    if (std::string(entry.name).rfind("profiler::_record_function_", 0) != 0) continue;
    for (const auto& h : resolveEntry(entry.name)) record_function_.insert(opId(h));
  }
}

void ResolvedOpTables::addSet(c10::ArrayRef<OpEntry> table, const char* label, std::unordered_set<OpId>& into) {
  for (const OpEntry& entry : table) {
    const auto handles = resolveEntry(entry.name);
    TORCH_CHECK(!handles.empty() || entry.optional, "hpac: required op table entry '", entry.name, "' (", label,
                " table) is not registered in this process");
    for (const auto& h : handles) into.insert(opId(h));
  }
}

void ResolvedOpTables::add(c10::ArrayRef<OpEntry> table, OpCategory category) {
  for (const OpEntry& entry : table) {
    const auto handles = resolveEntry(entry.name);
    if (handles.empty()) {
      TORCH_CHECK(entry.optional, "hpac: required op table entry '", entry.name, "' (", toString(category),
                  " table) is not registered in this process; this torch is not supported by hpac's "
                  "built-in selective policy");
      missing_optional_.emplace_back(entry.name);
      continue;
    }
    for (const auto& h : handles) category_.emplace(opId(h), category);
  }
}

// Note [Ops registered later]
// Custom operators can be registered at any time: FSDP2 defines fsdp::* from
// Python when torch.distributed.fsdp is imported, extensions when loaded. A
// table resolved once at first use would miss them for good (fsdp lifecycle
// ops would then be counted and shift every later occurrence index). So a
// dispatcher registration listener bumps a generation counter whenever an
// operator named by an optional entry is registered, and global() resolves
// again when the generation moved. The listener runs under the dispatcher's
// lock: it only compares the name against an immutable set and bumps an
// atomic, and never takes the tables' mutex (resolution takes that mutex and
// then the dispatcher's lock).
namespace {

struct TableRegistry {
  std::unordered_set<std::string> watched;  // op names (no overload) of the optional entries
  std::atomic<uint64_t> generation{0};      // bumped when a watched op is registered
  std::mutex mutex;
  std::vector<std::unique_ptr<const ResolvedOpTables>> resolved;  // never freed: see global()
  std::atomic<const ResolvedOpTables*> latest{nullptr};
  std::atomic<uint64_t> latest_generation{~uint64_t{0}};
  std::unique_ptr<c10::RegistrationHandleRAII> listener;  // kept for the process, like the registry
};

class WatchedOpListener final : public c10::OpRegistrationListener {
 public:
  explicit WatchedOpListener(TableRegistry& registry) : registry_(registry) {}
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    if (registry_.watched.count(op.operator_name().name) != 0) registry_.generation.fetch_add(1);
  }
  void onOperatorDeregistered(const c10::OperatorHandle& op) override { onOperatorRegistered(op); }

 private:
  TableRegistry& registry_;
};

TableRegistry& tableRegistry() {
  static TableRegistry* registry = [] {
    auto* r = new TableRegistry();  // leaked: the listener may fire during static destruction
    for (auto table : {ignoredOps(), recomputeOps(), matmulOps(), saveOps(), unsafeAliasOps(), routingOps()}) {
      for (const OpEntry& e : table) {
        if (e.optional) r->watched.insert(parseEntry(e.name).name);
      }
    }
    r->listener = std::make_unique<c10::RegistrationHandleRAII>(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<WatchedOpListener>(*r)));
    return r;
  }();
  return *registry;
}

}  // namespace

const ResolvedOpTables& ResolvedOpTables::global() {
  TableRegistry& r = tableRegistry();
  const ResolvedOpTables* latest = r.latest.load(std::memory_order_acquire);
  if (latest != nullptr && r.latest_generation.load(std::memory_order_acquire) == r.generation.load()) {
    return *latest;
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  const uint64_t generation = r.generation.load();
  latest = r.latest.load(std::memory_order_acquire);
  if (latest != nullptr && r.latest_generation.load(std::memory_order_acquire) == generation) return *latest;
  r.resolved.push_back(std::make_unique<const ResolvedOpTables>());
  latest = r.resolved.back().get();
  r.latest.store(latest, std::memory_order_release);
  r.latest_generation.store(generation, std::memory_order_release);
  return *latest;
}

int64_t ResolvedOpTables::resolutions() {
  TableRegistry& r = tableRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return static_cast<int64_t>(r.resolved.size());
}

}  // namespace hpac
