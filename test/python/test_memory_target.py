"""hpac.fit_memory_target on a plain torch model (any torch hpac supports; hpac.checkpoint's frame): the step's live
tensor bytes under a target between full's and off's measured peaks, parameters bitwise equal to an off run, and the
entry's errors for bad targets and layers. The transformers path is test/python/hf/test_hf_memory_target.py."""
import gc

import pytest
import torch

import hpac

STEPS = 4


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, width=64, depth=4):
        super().__init__()
        self.inp = torch.nn.Linear(width, width)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return (x * x).mean()


def _train(how, target=None, optimizer=torch.optim.SGD, garbage=None):
    """(parameters after STEPS steps, per-step peak of hpac.cpu_tensor_memory_stats, the MemoryTarget or None).
    garbage: a list of tensors alive as step 1 starts, emptied during step 1 (after the first layer's forward)."""
    torch.manual_seed(3)
    model = Net()
    opt = optimizer(model.parameters(), lr=0.1)
    fitted = None
    if how == "full":
        for layer in model.layers:
            hpac.checkpoint_wrapper(layer, "full")
    elif how == "target":
        fitted = hpac.fit_memory_target(model, model.layers, target, optimizer=opt if garbage is not None else None)
    handle = model.layers[1].register_forward_pre_hook(lambda module, args: garbage.clear()) if garbage else None
    peaks = []
    for step in range(STEPS):
        x = torch.randn(512, 64, generator=torch.Generator().manual_seed(step))
        hpac.reset_cpu_tensor_peak()
        model(x).backward()
        opt.step()
        opt.zero_grad()
        peaks.append(hpac.cpu_tensor_memory_stats()["peak_bytes"])
    if handle is not None:
        handle.remove()
    params = [p.detach().clone() for p in model.parameters()]
    del model, opt
    gc.collect()
    return params, peaks, fitted


def test_a_plain_model_fits_its_target_and_trains_as_off():
    hpac.track_memory()
    gc.collect()
    off_params, off_peaks, _ = _train("off")
    _, full_peaks, _ = _train("full")
    assert max(full_peaks) < max(off_peaks)
    target = (max(full_peaks) + max(off_peaks)) // 2
    params, peaks, fitted = _train("target", target)
    planned = [row for row in fitted.history if row["planned"]]
    assert planned and all(row["measured_bytes"] <= target for row in planned), fitted.history
    assert max(peaks) <= target, peaks  # every step, the profile step included
    planned_micros = sum(p.recompute_micros for p in fitted.plan)
    assert all(planned_micros <= u["recompute_micros"] + 1e-6 for u in fitted.uniform_plans() if u["fits"])
    assert all(torch.equal(a, b) for a, b in zip(params, off_params))
    report = fitted.report()
    assert report["target_bytes"] == target and len(report["layers"]) == 4


@pytest.mark.skipif(not hasattr(torch.optim.Optimizer, "register_step_post_hook"), reason="torch < 2.0")
def test_bytes_freed_during_the_profile_step_do_not_lower_the_first_plan():
    """Bytes alive as step 1 starts and freed during it (a variable still holding the previous model's loss, and so
    its graph and parameters, until the first forward rebinds it) are not part of the step. The first plan takes the
    profile step's start plus what its optimizer step made (AdamW's state), not step 2's start, which lacks them
    (Note [Profile, then absolute bases]): without it step 2 went over by what was freed."""
    hpac.track_memory()
    gc.collect()
    _, off_peaks, _ = _train("off", optimizer=torch.optim.AdamW)
    _, full_peaks, _ = _train("full", optimizer=torch.optim.AdamW)
    target = (max(full_peaks) + max(off_peaks)) // 2
    garbage = [torch.empty((max(off_peaks) - max(full_peaks)) // 4, dtype=torch.uint8)]
    _, peaks, fitted = _train("target", target, optimizer=torch.optim.AdamW, garbage=garbage)
    assert not garbage and fitted.history[1]["planned"]
    assert max(peaks) <= target, (peaks, target, fitted.history)


@pytest.mark.parametrize("target, message", [
    # Note [One size grammar] (policy/byte_size.h): the YAML's messages, word for word
    ("70GB", r"'70GB' has unit 'GB'; allowed: .*B, KiB, MiB, GiB or TiB"),
    ("0MiB", r"'0MiB' is zero bytes"),
    ("1000", r"'1000' is a plain number; the target is bytes with a unit"),
    ("1e3GiB", r"'1e3GiB' is not a size"),
    (-5, r"-5 is not above zero"),
    (1.5, r"1\.5 is a float"),
])
def test_bad_targets_name_what_is_allowed(target, message):
    with pytest.raises(hpac.MemoryTargetError, match=message):
        hpac.fit_memory_target(Net(), Net().layers, target)


def test_layers_must_be_modules():
    with pytest.raises(hpac.MemoryTargetError, match="at least one layer"):
        hpac.fit_memory_target(Net(), [], "1GiB")
    with pytest.raises(TypeError, match="layer 1 is a str, not a torch.nn.Module"):
        model = Net()
        hpac.fit_memory_target(model, [model.layers[0], "layer"], "1GiB")


def test_layers_out_of_forward_order_are_an_error_after_the_profile_step():
    hpac.track_memory()
    model = Net()
    fitted = hpac.fit_memory_target(model, list(model.layers)[::-1], "1GiB")
    x = torch.randn(64, 64)
    model(x).backward()
    with pytest.raises(hpac.MemoryTargetError, match=r"ran the layers in the order \[layer 3, layer 2, layer 1, "
                       r"layer 0\], not once each in the order given"):
        model(x)
    fitted.remove()


@pytest.mark.skipif(not hasattr(torch.optim.Optimizer, "register_step_post_hook"), reason="torch < 2.0")
def test_gradient_accumulation_under_a_watched_optimizer_is_an_error():
    hpac.track_memory()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fitted = hpac.fit_memory_target(model, model.layers, "1GiB", optimizer=opt)
    x = torch.randn(64, 64)
    model(x).backward()
    with pytest.raises(hpac.MemoryTargetError, match="called again without optimizer.step"):
        model(x)
    fitted.remove()


def test_nothing_outlives_a_target_model():
    """The target, its wrappers, tensor hooks and regions die with the model: after steps, a forward dropped
    without backward and `del`, the live bytes are back where they were and the model is collected."""
    import weakref
    hpac.track_memory()
    gc.collect()
    start = hpac.cpu_tensor_memory_stats()["current_bytes"]
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fitted = hpac.fit_memory_target(model, model.layers, "1GiB")
    for step in range(3):
        model(torch.randn(256, 64)).backward()
        opt.step()
        opt.zero_grad()
    dropped = model(torch.randn(256, 64))  # never backward
    alive = weakref.ref(model), weakref.ref(fitted)
    del dropped, model, opt, fitted
    gc.collect()
    assert all(r() is None for r in alive)
    assert hpac.cpu_tensor_memory_stats()["current_bytes"] == start
    assert torch.ops.hpac.invocations_alive() == 0


class Spike(torch.nn.Module):
    """A layer whose largest transient comes first: `wide` (8x the width, a matmul's output) is read by a sum only, so
    nothing keeps it; then twelve tanh, each of whose outputs autograd saves, so what off keeps (about 12x the width)
    outgrows the transient by the forward's end."""

    def __init__(self, width):
        super().__init__()
        self.wide = torch.nn.Linear(width, 8 * width, bias=False)

    def forward(self, x):
        y = x * torch.sigmoid(self.wide(x).sum(-1, keepdim=True))
        for _ in range(12):
            y = torch.tanh(y)
        return y


def _forward_peak(run):
    """The peak live bytes above those alive before `run()`, while it runs (its output dropped after)."""
    gc.collect()
    start = hpac.cpu_tensor_memory_stats()["current_bytes"]
    hpac.reset_cpu_tensor_peak()
    out = run()
    peak = hpac.cpu_tensor_memory_stats()["peak_bytes"] - start
    del out
    return peak


def test_a_forward_holds_its_transients_and_what_it_has_kept_so_far():
    """Note [A forward, op by op]: what a layer's forward holds at its highest moment, computed from its profile,
    against the same forward run unwrapped, under the plan keeping nothing and under the plan keeping what off keeps:
    within 2 %, where the bound the planner had before (the largest transient plus everything kept) is 1.5x off's."""
    hpac.track_memory()
    torch.manual_seed(0)
    layer = Spike(256)
    x = torch.randn(1024, 256, requires_grad=True)
    budget = hpac.budget(bytes=0)
    hpac.checkpoint(layer, x, policy=budget).sum().backward()  # the profile
    profiled, off = budget._region.forward_bytes()
    off_kept = budget.status()["off_bytes"]
    measured_off = _forward_peak(lambda: layer(x))
    measured_none = _forward_peak(lambda: hpac.checkpoint(layer, x, policy=budget))
    budgets, kept, _, _, forward = budget._region.candidates([0, off_kept])
    budget._region.replan(off_kept)
    measured_all = _forward_peak(lambda: hpac.checkpoint(layer, x, policy=budget))
    assert abs(off - measured_off) <= 0.02 * measured_off, (off, measured_off)
    assert abs(profiled - measured_none) <= 0.02 * measured_none, (profiled, measured_none)
    assert forward[0] == profiled
    assert abs(forward[1] - measured_all) <= 0.02 * measured_all, (forward[1], measured_all)
    assert profiled + off_kept > 1.5 * measured_off  # the bound
