// hpac/replay/explain.h
//
// Explain: what one checkpoint region did with each op, and why, and what the
// step's tensor memory looked like.
//   DecisionRecorder  attached to one invocation (InvocationOptions::recorder,
//                     CheckpointOptions::explain): every op the fallback hands
//                     to it is recorded with the decision, the rule behind it
//                     (Policy::reason(): the policy's table or rule, or the
//                     budget plan entry), its output bytes and measured time.
//                     Without a recorder the fallback pays one branch per op
//                     (Invocation::timing()).
//   TimelineCapture   tensor bytes alive (TrackingAllocator) after every
//                     allocation and free while it is alive: one step's memory
//                     timeline.
//   ExplainReport     both, rendered as a text table, JSON and an SVG
//                     timeline by the CLI (tools/explain), hpac-train
//                     --explain and Python's hpac.explain (docs/explain.md).
#pragma once

#include "replay/invocation.h"
#include "replay/phase.h"
#include "replay/storage_ids.h"
#include "replay/tracking_allocator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hpac {

// One op as an invocation handled it.
struct ExplainedOp {
  Phase phase = Phase::kForward;
  std::string op;          // "aten::mm", "aten::max.dim"
  int64_t occurrence = -1; // of this op in this phase; -1 for ignored ops
  // forward: save | recompute | ignore; recompute: serve | recompute | skip | ignore
  std::string decision;
  std::string answer;      // the policy's CheckpointPolicy (forward, counted ops), else ""
  std::string rule;        // why: Policy::reason(); in the recompute, the forward's record it replays (or, for a
                           // write not made again, Note [State written twice])
  // Bytes of new storage the outputs occupy: an output whose storage the
  // region already had (a view or in-place result of an input or of an
  // earlier output) costs nothing.
  int64_t output_bytes = 0;
  // Bytes the decision keeps alive until the recompute (forward saves only):
  // storages not already kept by an earlier save (a saved view of a kept
  // output adds nothing), plus the snapshot a saved in-place op takes of what
  // it wrote.
  int64_t kept_bytes = 0;
  double micros = 0;       // measured time of the op in this phase (a served op: the serve, no kernel)
};

class DecisionRecorder {
 public:
  const std::vector<ExplainedOp>& ops() const { return ops_; }
  // Rows of `phase` with `decision`.
  int64_t count(Phase phase, const std::string& decision) const;

  // Filled by the invocation it is attached to (Invocation::observeArguments / observe):
  // Forward, before a timed op: names the storages of its arguments (Note [Explain's byte accounting]).
  void noteArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // After the op, its returns on `stack`: appends `row`, in which the invocation gave the phase, op, occurrence
  // (-1: ignored), decision and time, and for a counted forward op the policy's answer and rule. A counted forward
  // op's row gets its output and kept bytes (Note [Explain's byte accounting]); a counted recompute op's rule names
  // the forward's row it replays.
  void record(ExplainedOp row, const c10::OperatorHandle& op, const torch::jit::Stack& stack);

 private:
  std::vector<ExplainedOp> ops_;
  std::map<std::pair<std::string, int64_t>, size_t> forward_rows_;  // (op, occurrence) -> row
  StorageIds seen_;                  // storages the forward's ops read or wrote
  std::unordered_set<int64_t> kept_; // ids of storages kept by saves
};

// Tensor bytes over one step, relative to the bytes alive when capture began.
struct TimelineTrace {
  std::string mode;
  std::vector<int64_t> bytes;                         // after each allocation and free
  std::vector<std::pair<std::string, int64_t>> marks; // (label, index into bytes), e.g. ("backward", 812)
  int64_t peak_bytes = 0;
};

// RAII: the TrackingAllocator is the CPU allocator and sampled until finish()
// or destruction, then uninstalled unless someone installed it for good (Note
// [The tracker is installed while asked for]). One capture at a time per process.
class TimelineCapture {
 public:
  TimelineCapture();
  ~TimelineCapture();
  TimelineCapture(const TimelineCapture&) = delete;
  TimelineCapture& operator=(const TimelineCapture&) = delete;
  void mark(const std::string& label);
  TimelineTrace finish(const std::string& mode);

 private:
  std::vector<int64_t> samples_;
  std::vector<std::pair<std::string, int64_t>> marks_;
  int64_t baseline_ = 0;
  bool active_ = false;
  std::optional<TrackingAllocator::Scope> tracking_;
};

struct ExplainReport {
  std::string source;  // what ran: "MoE block stack (2 blocks, ...)", "hpac-train qwen3_moe_tiny"
  std::string region;  // the region explained: "block 0", "layer 0"
  std::string mode;    // its mode
  std::vector<ExplainedOp> ops;
  InvocationStats stats;                // the explained invocation's
  std::vector<TimelineTrace> timelines; // one per mode
};

// Per-op table and a summary. `max_rows` > 0 keeps the first rows of each phase.
std::string formatExplainTable(const ExplainReport& report, size_t max_rows = 0);
// {"schema": "hpac.explain/1", ...}; docs/explain.md describes the fields.
std::string explainJson(const ExplainReport& report);
// One polyline per timeline, tensor bytes over allocator events.
std::string timelineSvg(const std::vector<TimelineTrace>& timelines, const std::string& title);
// Writes `text` to `path`; throws c10::Error naming the path (what: "JSON", "SVG") when it cannot.
void writeTextFile(const std::string& path, const std::string& text, const char* what);
// Before a run: throws c10::Error naming the path when its folder does not exist or is not writable.
void checkWritablePath(const std::string& path, const char* what);

}  // namespace hpac
