// hpac/replay/rng_state.h
//
// RngState: the default generators' states at the start of a checkpoint's
// forward (CPU, plus every CUDA device an input lives on), restored for the
// recompute so that dropout and other random ops draw the same numbers.
// RngFork: RAII, installs a captured state and puts back the states it found,
// so the caller's random stream is untouched by the recompute.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace hpac {

class RngState {
 public:
  RngState() = default;
  // Captures the CPU generator and the generators of the CUDA devices of `tensors`.
  static RngState capture(const std::vector<at::Tensor>& tensors);
  static RngState captureDevices(const std::vector<c10::Device>& devices);
  void restore() const;
  const std::vector<c10::Device>& devices() const { return devices_; }
  bool empty() const { return states_.empty(); }

 private:
  std::vector<c10::Device> devices_;
  std::vector<at::Tensor> states_;
};

class RngFork {
 public:
  explicit RngFork(const RngState& target);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState saved_;
  bool active_;
};

}  // namespace hpac
