// Per-op cost of hpac's fallback, in one process, on the same loop of small adds:
//   (a) BM_Add_NotLoaded       libhpac.so not loaded yet
//   (b) BM_Add_LoadedNoRegion  loaded (dlopen), no region active: the fallback is never reached
//   (c) BM_Add_RegionForward   inside a region, forward phase: counted, policy asked, kernel run
//   (d) BM_Add_RegionServe     inside a region, recompute phase: every op served from cache, kernel skipped
// This binary does not link hpac: (a) runs first, then the library is loaded through dlopen and driven
// through its C API (plugin/c_api.h). Counter ns_per_op is the time per add; compare medians of
// repetitions (--benchmark_repetitions=N --benchmark_report_aggregates_only=true).
#include "plugin/c_api.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

constexpr int kOps = 1000;

struct HpacApi {
  decltype(&hpac_invocation_create) create;
  decltype(&hpac_region_enter) enter;
  decltype(&hpac_region_exit) exit;
  decltype(&hpac_invocation_destroy) destroy;
  decltype(&hpac_last_error) last_error;
};

const HpacApi& hpac() {
  static const HpacApi api = [] {
    const char* env = std::getenv("HPAC_LIBRARY");
    const std::string path = env ? env : HPAC_LIBRARY_PATH;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw std::runtime_error("cannot load " + path + ": " + dlerror());
    auto sym = [&](const char* name) {
      void* p = dlsym(handle, name);
      if (!p) throw std::runtime_error(std::string("libhpac.so lacks ") + name);
      return p;
    };
    return HpacApi{reinterpret_cast<decltype(&hpac_invocation_create)>(sym("hpac_invocation_create")),
                   reinterpret_cast<decltype(&hpac_region_enter)>(sym("hpac_region_enter")),
                   reinterpret_cast<decltype(&hpac_region_exit)>(sym("hpac_region_exit")),
                   reinterpret_cast<decltype(&hpac_invocation_destroy)>(sym("hpac_invocation_destroy")),
                   reinterpret_cast<decltype(&hpac_last_error)>(sym("hpac_last_error"))};
  }();
  return api;
}

void check(int rc) {
  if (rc != 0) throw std::runtime_error(hpac().last_error());
}

void addLoop(const at::Tensor& a, const at::Tensor& b) {
  for (int i = 0; i < kOps; ++i) benchmark::DoNotOptimize(at::add(a, b));
}

void report(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * kOps);
  state.counters["ns_per_op"] = benchmark::Counter(static_cast<double>(state.iterations()) * kOps * 1e-9,
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Add_NotLoaded(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) addLoop(a, b);
  report(state);
}

void BM_Add_LoadedNoRegion(benchmark::State& state) {
  hpac();
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) addLoop(a, b);
  report(state);
}

void BM_Add_RegionForward(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) {
    hpac_invocation* inv = nullptr;
    check(hpac().create("full", &inv));
    check(hpac().enter(inv, 0));
    addLoop(a, b);
    check(hpac().exit(inv));
    hpac().destroy(inv);
  }
  report(state);
}

void BM_Add_RegionServe(benchmark::State& state) {
  const at::Tensor a = at::ones({8}), b = at::ones({8});
  for (auto _ : state) {
    state.PauseTiming();
    hpac_invocation* inv = nullptr;
    check(hpac().create("save_all", &inv));
    check(hpac().enter(inv, 0));
    addLoop(a, b);
    check(hpac().exit(inv));
    state.ResumeTiming();
    check(hpac().enter(inv, 1));
    addLoop(a, b);
    check(hpac().exit(inv));
    state.PauseTiming();
    hpac().destroy(inv);
    state.ResumeTiming();
  }
  report(state);
}

// Registration order is run order: (a) must run before anything loads hpac.
BENCHMARK(BM_Add_NotLoaded);
BENCHMARK(BM_Add_LoadedNoRegion);
BENCHMARK(BM_Add_RegionForward);
BENCHMARK(BM_Add_RegionServe);

}  // namespace

BENCHMARK_MAIN();
