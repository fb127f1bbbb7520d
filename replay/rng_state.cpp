#include "replay/rng_state.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <mutex>

namespace hpac {
namespace {

at::Generator generatorFor(const c10::Device& device) {
  return device.is_cpu() ? at::globalContext().defaultGenerator(c10::DeviceType::CPU)
                         : at::globalContext().defaultGenerator(device);
}

}  // namespace

RngState RngState::capture(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices{c10::Device(c10::DeviceType::CPU)};
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return captureDevices(devices);
}

RngState RngState::captureDevices(const std::vector<c10::Device>& devices) {
  RngState state;
  state.devices_ = devices;
  for (const c10::Device& d : devices) {
    at::Generator gen = generatorFor(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    state.states_.push_back(gen.get_state());
  }
  return state;
}

void RngState::restore() const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    at::Generator gen = generatorFor(devices_[i]);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(states_[i]);
  }
}

RngFork::RngFork(const RngState& target) : active_(!target.empty()) {
  if (!active_) return;
  saved_ = RngState::captureDevices(target.devices());
  target.restore();
}

RngFork::~RngFork() {
  if (active_) saved_.restore();
}

}  // namespace hpac
