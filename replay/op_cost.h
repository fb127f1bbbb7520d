// hpac/replay/op_cost.h
//
// Note [Estimated op costs]
// A profile timed with a host clock around each op measures, on an
// accelerator, the kernel's launch, not the kernel: CUDA ops return before
// they run. Besides the measured time (synchronised on accelerators, Note
// [Profiles wait for the device] in plugin/fallback.cpp) each profiled op gets
// an estimate from what it computes and moves, on the device's roofline:
//   flops  2·M·N·K for the matmul family (mm, addmm, bmm, baddbmm, addbmm,
//          matmul, linear, _grouped_mm), 4·B·H·Lq·Lk·D for the attention
//          kernels (two matmuls), 2·N·Cout·Cin/groups·kernel·output for
//          convolutions; 0 for every other op (memory bound);
//   bytes  the tensor arguments' and returns' bytes;
//   time   max(flops / peak flop rate, bytes / memory bandwidth), both
//          measured once per device type in the process (the median of 9 runs
//          of a float32 matmul and of a copy of 32 MiB, hpac's key excluded,
//          so no region sees them), or pinned for every device by
//          HPAC_ROOFLINE="<flops per µs>:<bytes per µs>".
// Plans made from the estimate (BudgetSpec::cost, `cost: estimated`) depend
// on no op's timing, only on the two rates: the same in every call of a
// process, and in every process with HPAC_ROOFLINE pinned. Unpinned, two
// processes measure slightly different rates (a busy core) and a plan can
// differ where ops are close (bench/budget/plan_stability.py measures it; rounding
// the rates to powers of two was tried and flips a whole factor of two).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>

namespace hpac {

struct OpWork {
  double flops = 0;
  int64_t bytes = 0;            // of the tensor arguments, and after the op of its returns too
  double flops_per_output = 0;  // convolutions: counted per output element once it exists
};

// Before the op runs (its arguments on top of the stack): its flops and the
// bytes of its tensor arguments.
OpWork argumentWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// After it ran (its returns on top of the stack): `arguments` plus the returns'
// bytes (and a convolution's flops).
OpWork returnWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const OpWork& arguments);

// Waits for the work queued on the device's current stream (nothing on CPU):
// the roofline's calibration and Note [Profiles wait for the device].
void waitForDevice(c10::Device device);

struct Roofline {
  double flops_per_us = 0;  // peak of a float32 matmul
  double bytes_per_us = 0;  // read + write of a copy
  // A device spec's peak per dtype (Note [A device that is not here]); a dtype not named uses flops_per_us.
  std::map<c10::ScalarType, double> flops_per_us_by_dtype;
  double flopsPerMicro(c10::ScalarType dtype) const {
    auto it = flops_per_us_by_dtype.find(dtype);
    return it == flops_per_us_by_dtype.end() ? flops_per_us : it->second;
  }
};

// The device type's roofline, measured on first use (thread-safe; a few tens
// of milliseconds once per device type and process).
//
// Note [The roofline is measured outside regions]
// The calibration allocates (two 32 MiB buffers and two matrices): inside a
// checkpointed forward that would add to the very peak the budget plans
// against, once per process. The front ends ask for the roofline when a budget
// region is made (hpac.budget: the CPU's, and CUDA's where torch has it; the
// trainer's budgetSpec: the CPU's), so a profile finds it measured; a device
// first met inside a region is still measured there.
const Roofline& deviceRoofline(c10::Device device);

// Note [A device that is not here]
// A plan for a device this process does not have (hpac.plan runs the step on
// the meta device) times ops on that device's datasheet: its peak flop rate
// per dtype and its memory bandwidth (hpac's device specs,
// plugin/python/hpac/_devices.py), set here for a device type before the
// step. The meta device has no roofline of its own: its ops get no estimate
// (0 µs) until one is set. Setting one replaces what the type had.
void setRoofline(c10::DeviceType type, Roofline roofline);
// Every device type's roofline now, and putting such a copy back (hpac.plan sets the meta device's for its steps
// and leaves the process's rooflines as it found them).
std::map<c10::DeviceType, Roofline> rooflinesNow();
void restoreRooflines(std::map<c10::DeviceType, Roofline> saved);
// Whether `device` has a roofline (measured or set; the meta device only when set).
bool hasRoofline(c10::Device device);

// Time on `roofline` of `flops` in `dtype` and `bytes` moved.
double estimatedMicros(double flops, int64_t bytes, const Roofline& roofline,
                       c10::ScalarType dtype = c10::ScalarType::Float);

}  // namespace hpac
