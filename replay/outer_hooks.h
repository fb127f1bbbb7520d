// hpac/replay/outer_hooks.h
//
// OuterHooks: the saved-tensor hooks active around a checkpoint region
// (torch.autograd.graph.saved_tensors_hooks, save_on_cpu, transformers'
// offloading), for what hpac itself keeps (Note [Outer saved-tensor hooks]).
#pragma once

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <cstddef>
#include <memory>

namespace hpac {

// Note [Outer saved-tensor hooks]
// Autograd hands every tensor it saves to the default saved-tensor hooks on
// top of the thread's stack; a checkpoint pushes its own pair there (torch's
// _checkpoint_hook, hpac.checkpoint's frame), which is how it drops them. What
// a selective region keeps instead — the saved ops' outputs, the snapshots of
// arguments they wrote — never passes through autograd, so a user's hooks
// around the region (save_on_cpu, an offloader) would not see exactly the
// tensors that stay alive until backward (pytorch#158657, #170284; torch's own
// SAC bypasses them unless asked, PR #190581). hpac hands them to those hooks:
// when a region's forward begins, the thread's hooks stack without the
// frame's own pairs on top is captured; when the forward ends, every tensor
// still kept is packed by a fresh pair built from that stack (the engine's
// get_default_saved_variable_hooks(), with the captured stack swapped in for
// the call), and the region keeps only what pack returned; serving unpacks it.
// Packing at the end of the forward, not at each save, lets writes inside the
// region reach the kept outputs first (Note [Copy on write]). With no outer
// hooks (the usual case, and every pure C++ process: libtorch's default hooks
// are Python's) nothing changes. respect_saved_tensors_hooks = false restores
// the bypass. Routing copies (Note [Routing is verified]) are not packed: they
// are compared, never served.
class OuterHooks {
 public:
  // The hooks around the region: the thread's stack without its top `frame_hooks` pairs; nullptr when none is
  // left (or saved-tensor hooks are disabled).
  static std::shared_ptr<const OuterHooks> capture(size_t frame_hooks);
  // A new pack/unpack pair of those hooks (one per packed tensor); nullptr if the engine gives none.
  std::unique_ptr<torch::autograd::SavedVariableHooks> make() const;

 private:
  at::impl::SavedTensorDefaultHooksTLS tls_;
};

}  // namespace hpac
