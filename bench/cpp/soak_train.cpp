// hpac-soak: the main job's trainer (hpac-train's Trainer, libtorch only) for many steps, with what a long training
// run meets: every --faults-every steps a forward whose graph is dropped without backward, a step whose forward ends
// in an exception inside a checkpointed layer and one whose backward (the recompute) does, both from a simulated out
// of memory (TrackingAllocator::failAfter); every --rebuild-every steps the Trainer (model, hpac's preparation,
// AdamW) rebuilt from the config. Every --sample steps: live tensor bytes after the step (hpac's tracking allocator),
// the process's resident set (/proc/self/statm), hpac::Invocation objects alive. Writes the samples and the summary
// as JSON (bench/soak/soak.py reads and reports it; docs/reliability.md, "Memory across a run").
//
//   build/bench/hpac-soak --config examples/training_demo/train.yaml [--mode M] [--steps 10000] [--json FILE]
#include "replay/invocation.h"
#include "replay/tracking_allocator.h"
#include "tools/trainer/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

namespace {

using hpac::TrackingAllocator;
using hpac::trainer::Trainer;

struct Options {
  std::string config;
  std::string mode;
  std::string json;
  int64_t steps = 10000;
  int64_t faults_every = 50;
  int64_t rebuild_every = 2000;
  int64_t sample = 100;
};

int64_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "hpac-soak: " << problem
            << "\nusage: hpac-soak --config FILE [--mode off|full|selective|budget] [--steps N] [--faults-every N] "
               "[--rebuild-every N] [--sample N] [--json FILE]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("flag '" + flag + "' needs a value");
    const std::string value = argv[++i];
    auto count = [&](int64_t& out) {
      char* end = nullptr;
      out = std::strtoll(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || out < 1) usage(flag + " expects a positive integer, got '" + value + "'");
    };
    if (flag == "--config") o.config = value;
    else if (flag == "--mode") o.mode = value;
    else if (flag == "--json") o.json = value;
    else if (flag == "--steps") count(o.steps);
    else if (flag == "--faults-every") count(o.faults_every);
    else if (flag == "--rebuild-every") count(o.rebuild_every);
    else if (flag == "--sample") count(o.sample);
    else usage("unknown flag '" + flag + "'");
  }
  if (o.config.empty()) usage("--config is required");
  return o;
}

// Runs `fn` with the tracker's `n`-th allocation from now failing; returns whether the simulated OOM came out.
template <class Fn>
bool failing(TrackingAllocator& tracker, int64_t n, Fn&& fn) {
  tracker.failAfter(n);
  bool raised = false;
  try {
    fn();
  } catch (const c10::Error& e) {
    raised = std::string(e.what()).find("simulated out of memory") != std::string::npos;
    if (!raised) throw;
  }
  tracker.failAfter(0);
  return raised;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  auto config = hpac::trainer::loadConfig(o.config);
  if (!config.ok()) usage(std::string(config.status().message()));
  if (!o.mode.empty() && !hpac::parseCheckpointMode(o.mode, &config->activation_checkpoint.mode)) {
    usage("--mode '" + o.mode + "' is not allowed; allowed: off, full, selective, budget");
  }
  const auto quiet = [](hpac::trainer::LogLevel, const std::string&) {};
  const auto registry = hpac::trainer::builtinRegistry().value();
  TrackingAllocator& tracker = TrackingAllocator::install();
  std::unique_ptr<Trainer> trainer;
  auto build = [&] {
    trainer.reset();
    auto made = Trainer::create(*config, registry, quiet);
    if (!made.ok()) usage(std::string(made.status().message()));
    trainer = std::move(*made);
  };
  build();
  std::ofstream json;
  if (!o.json.empty()) {
    json.open(o.json);
    if (!json) usage("cannot write --json " + o.json);
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t dropped = 0, forward_faults = 0, recompute_faults = 0, rebuilds = 0;
  std::string samples;
  for (int64_t s = 0; s < o.steps; ++s) {
    if (s > 0 && s % o.rebuild_every == 0) {
      build();
      ++rebuilds;
    }
    if (s > 0 && s % o.faults_every == 0) {
      const at::Tensor tokens = hpac::trainer::tokenBatch(*config, s);
      { at::Tensor dropped_loss = trainer->model().loss(tokens); }  // evaluation in train mode: no backward
      ++dropped;
      // A step that fails in its forward (the 50th allocation: inside the first layers), then one that fails in
      // its backward: the recompute of a checkpointed layer allocates again (Faults.OutOfMemoryDuringTheRecompute..).
      forward_faults += failing(tracker, 50, [&] { trainer->model().loss(tokens); });
      recompute_faults += failing(tracker, 400, [&] {
        at::Tensor loss = trainer->model().loss(tokens);
        loss.backward();
      });
      for (at::Tensor& p : trainer->model().parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
    trainer->step(s);
    if ((s + 1) % o.sample == 0 || s + 1 == o.steps) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char row[256];
      std::snprintf(row, sizeof(row), "%s{\"step\": %lld, \"tensor_bytes\": %lld, \"rss_bytes\": %lld, "
                    "\"invocations_alive\": %lld, \"seconds\": %.3f}", samples.empty() ? "" : ",\n  ",
                    static_cast<long long>(s + 1), static_cast<long long>(tracker.currentBytes()),
                    static_cast<long long>(residentBytes()),
                    static_cast<long long>(hpac::Invocation::alive()), seconds);
      samples += row;
      std::cerr << "[hpac-soak] step " << s + 1 << "/" << o.steps << "  tensor bytes " << tracker.currentBytes()
                << "  rss " << residentBytes() / (1 << 20) << " MiB  invocations alive " << hpac::Invocation::alive()
                << "  " << static_cast<int64_t>(seconds) << " s\n";
    }
  }
  if (json) {
    json << "{\"program\": \"hpac-soak\", \"config\": \"" << o.config << "\", \"mode\": \""
         << hpac::toString(config->activation_checkpoint.mode) << "\", \"steps\": " << o.steps
         << ", \"faults_every\": " << o.faults_every << ", \"rebuild_every\": " << o.rebuild_every
         << ", \"dropped_forwards\": " << dropped << ", \"forward_faults\": " << forward_faults
         << ", \"recompute_faults\": " << recompute_faults << ", \"rebuilds\": " << rebuilds
         << ",\n \"samples\": [\n  " << samples << "]}\n";
  }
  return 0;
}
