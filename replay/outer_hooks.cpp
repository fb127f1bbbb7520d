#include "replay/outer_hooks.h"

#include <torch/csrc/autograd/engine.h>

namespace hpac {
namespace {

// Restores the thread's saved-tensor hooks state on scope exit.
class SwapHooks {
 public:
  explicit SwapHooks(const at::impl::SavedTensorDefaultHooksTLS& with)
      : saved_(at::SavedTensorDefaultHooks::get_tls_state()) {
    at::SavedTensorDefaultHooks::set_tls_state(with);
  }
  ~SwapHooks() { at::SavedTensorDefaultHooks::set_tls_state(saved_); }
  SwapHooks(const SwapHooks&) = delete;
  SwapHooks& operator=(const SwapHooks&) = delete;

 private:
  at::impl::SavedTensorDefaultHooksTLS saved_;
};

}  // namespace

std::shared_ptr<const OuterHooks> OuterHooks::capture(size_t frame_hooks) {
  at::impl::SavedTensorDefaultHooksTLS tls = at::SavedTensorDefaultHooks::get_tls_state();
  if (tls.disabled_error_message) return nullptr;
  for (size_t i = 0; i < frame_hooks && !tls.stack.empty(); ++i) tls.stack.pop();
  if (tls.stack.empty()) return nullptr;
  auto hooks = std::make_shared<OuterHooks>();
  hooks->tls_ = std::move(tls);
  return hooks;
}

std::unique_ptr<torch::autograd::SavedVariableHooks> OuterHooks::make() const {
  SwapHooks swap(tls_);
  return torch::autograd::Engine::get_default_engine().get_default_saved_variable_hooks();
}

}  // namespace hpac
