#include "replay/op_cost.h"

#include "replay/dispatch_key.h"
#include "replay/for_each_tensor.h"

#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hpac {
namespace {

int64_t bytesOf(const c10::IValue& v) {
  int64_t bytes = 0;
  forEachTensor(v, [&](const at::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  });
  return bytes;
}

// Sizes of argument i of `args` (the op's arguments), empty when it is no tensor.
c10::IntArrayRef sizesOf(const torch::jit::Stack& stack, size_t first, size_t i) {
  const c10::IValue& v = stack[first + i];
  return v.isTensor() && v.toTensor().defined() ? v.toTensor().sizes() : c10::IntArrayRef();
}

double product(c10::IntArrayRef s, size_t begin, size_t end) {
  double p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= static_cast<double>(s[i]);
  return p;
}

// 2·M·N·K of a @ b for a [..., M, K] and b [..., K, N] (batch dims of a counted).
double matmulFlops(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.empty() || b.empty()) return 0;
  const double k = static_cast<double>(a.back());
  const double n = b.size() >= 2 ? static_cast<double>(b.back()) : 1.0;
  return 2.0 * product(a, 0, a.size() - 1) * k * n;
}

double flopsOf(const std::string& name, const torch::jit::Stack& stack, size_t first, size_t num_args) {
  auto arg = [&](size_t i) { return i < num_args ? sizesOf(stack, first, i) : c10::IntArrayRef(); };
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul") return matmulFlops(arg(0), arg(1));
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm") return matmulFlops(arg(1), arg(2));
  if (name == "aten::linear") {  // weight [N, K]
    const c10::IntArrayRef x = arg(0), w = arg(1);
    return x.empty() || w.size() != 2 ? 0 : 2.0 * product(x, 0, x.size()) * static_cast<double>(w[0]);
  }
  if (name == "aten::_grouped_mm") {  // each row of a [M, K] meets one group's [K, N] of b [G, K, N]
    const c10::IntArrayRef a = arg(0), b = arg(1);
    return a.size() == 2 && !b.empty() ? 2.0 * product(a, 0, 2) * static_cast<double>(b.back()) : 0;
  }
  if (name.rfind("aten::_scaled_dot_product_", 0) == 0 && name.find("backward") == std::string::npos) {
    const c10::IntArrayRef q = arg(0), k = arg(1);  // [B, H, L, D]
    return q.size() == 4 && k.size() == 4 ? 4.0 * product(q, 0, 4) * static_cast<double>(k[2]) : 0;
  }
  return 0;
}

// Per output element of a convolution: 2·Cin/groups·kernel (weight [Cout, Cin/groups, k...]).
bool isConvolution(const std::string& name) {
  return name == "aten::convolution" || name == "aten::_convolution" || name.rfind("aten::conv", 0) == 0;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double medianMicros(c10::Device device, const std::function<void()>& work) {
  std::vector<double> times;
  for (int i = 0; i < 10; ++i) {  // the first is a warm-up
    waitForDevice(device);
    const auto start = std::chrono::steady_clock::now();
    work();
    waitForDevice(device);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) times.push_back(us);
  }
  return std::max(median(std::move(times)), 1e-3);
}

// HPAC_ROOFLINE="<flops per µs>:<bytes per µs>" pins every device's roofline (identical estimates, so identical
// plans, in every process); unset, each process measures its own.
std::optional<Roofline> pinnedRoofline() {
  const char* text = std::getenv("HPAC_ROOFLINE");
  if (text == nullptr || *text == '\0') return std::nullopt;
  Roofline r;
  char* end = nullptr;
  r.flops_per_us = std::strtod(text, &end);
  const bool colon = end != nullptr && *end == ':';
  if (colon) r.bytes_per_us = std::strtod(end + 1, &end);
  TORCH_CHECK(colon && end != nullptr && *end == '\0' && r.flops_per_us > 0 && r.bytes_per_us > 0 &&
                  std::isfinite(r.flops_per_us) && std::isfinite(r.bytes_per_us),
              "hpac: HPAC_ROOFLINE '", text, "' is not allowed; allowed: <flops per µs>:<bytes per µs>, two positive "
              "numbers (e.g. 100000:20000)");
  return r;
}

Roofline measure(c10::Device device) {
  if (auto pinned = pinnedRoofline()) return *pinned;
  // Not a region's ops: hpac's key is excluded. at::full, not randn: the generator's state stays the user's.
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  const int64_t n = device.is_cpu() ? 256 : 4096;
  const auto options = at::TensorOptions().device(device).dtype(at::kFloat);
  const at::Tensor a = at::full({n, n}, 0.5, options), b = at::full({n, n}, 0.25, options);
  Roofline r;
  r.flops_per_us = 2.0 * static_cast<double>(n * n * n) / medianMicros(device, [&] { (void)at::mm(a, b); });
  const int64_t elements = 8 << 20;  // 32 MiB of float32
  at::Tensor src = at::full({elements}, 1.0, options), dst = at::full({elements}, 0.0, options);
  r.bytes_per_us = 2.0 * 4.0 * static_cast<double>(elements) / medianMicros(device, [&] { dst.copy_(src); });
  return r;
}

}  // namespace

OpWork argumentWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack.size() - num_args;
  OpWork w;
  for (size_t i = first; i < stack.size(); ++i) w.bytes += bytesOf(stack[i]);
  const std::string& name = op.schema().name();
  w.flops = flopsOf(name, stack, first, num_args);
  if (isConvolution(name) && num_args >= 2) {
    const c10::IntArrayRef weight = sizesOf(stack, first, 1);
    w.flops_per_output = weight.size() >= 3 ? 2.0 * product(weight, 1, weight.size()) : 0;
  }
  return w;
}

OpWork returnWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const OpWork& arguments) {
  const size_t num_returns = op.schema().returns().size();
  OpWork w;
  w.flops = arguments.flops;
  w.bytes = arguments.bytes;
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) {
    w.bytes += bytesOf(stack[j]);
    if (arguments.flops_per_output > 0 && stack[j].isTensor()) {
      w.flops += arguments.flops_per_output * static_cast<double>(stack[j].toTensor().numel());
    }
  }
  return w;
}

void waitForDevice(c10::Device device) {
  if (device.is_cpu()) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  impl->synchronizeStream(impl->getStream(device));
}

namespace {

std::mutex& rooflineMutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<c10::DeviceType, Roofline>& rooflines() {
  static std::map<c10::DeviceType, Roofline> known;
  return known;
}

}  // namespace

const Roofline& deviceRoofline(c10::Device device) {
  std::lock_guard<std::mutex> lock(rooflineMutex());
  auto& known = rooflines();
  auto it = known.find(device.type());
  if (it == known.end()) {
    TORCH_CHECK(!device.is_meta(), "hpac: the meta device has no roofline of its own; a plan for a device that is "
                "not here sets one from a device spec first (Note [A device that is not here], hpac.plan)");
    it = known.emplace(device.type(), measure(device)).first;
  }
  return it->second;
}

std::map<c10::DeviceType, Roofline> rooflinesNow() {
  std::lock_guard<std::mutex> lock(rooflineMutex());
  return rooflines();
}

void restoreRooflines(std::map<c10::DeviceType, Roofline> saved) {
  std::lock_guard<std::mutex> lock(rooflineMutex());
  rooflines() = std::move(saved);
}

void setRoofline(c10::DeviceType type, Roofline roofline) {
  TORCH_CHECK(roofline.flops_per_us > 0 && roofline.bytes_per_us > 0 && std::isfinite(roofline.flops_per_us) &&
                  std::isfinite(roofline.bytes_per_us),
              "hpac: a roofline needs a positive flop rate and bandwidth; got ", roofline.flops_per_us,
              " flops per µs and ", roofline.bytes_per_us, " bytes per µs");
  for (const auto& [dtype, rate] : roofline.flops_per_us_by_dtype) {
    TORCH_CHECK(rate > 0 && std::isfinite(rate), "hpac: a roofline's ", c10::toString(dtype),
                " flop rate must be positive; got ", rate);
  }
  std::lock_guard<std::mutex> lock(rooflineMutex());
  rooflines()[type] = std::move(roofline);
}

bool hasRoofline(c10::Device device) {
  if (!device.is_meta()) return true;
  std::lock_guard<std::mutex> lock(rooflineMutex());
  return rooflines().count(device.type()) > 0;
}

double estimatedMicros(double flops, int64_t bytes, const Roofline& roofline, c10::ScalarType dtype) {
  return std::max(flops / roofline.flopsPerMicro(dtype), static_cast<double>(bytes) / roofline.bytes_per_us);
}

}  // namespace hpac
