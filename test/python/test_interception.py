"""What hpac's fallback sees inside a region, on whichever torch runs the tests (docs/design.md, "The dispatch key
per torch"): views, factories, out= and in-place ops, functional collectives with their wait, FSDP2's lifecycle ops
(ignored), profiler ranges (ignored) — each read off the invocation's op log, which lists every op the fallback
handed to it."""
import importlib

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same


def _torch_at_least(major, minor):
    return _major_minor(torch.__version__) >= (major, minor)


def op_log(fn, policy="selective"):
    inv = hpac.Invocation(policy, record_ops=True)
    with inv.region("forward"):
        fn()
    return inv.op_log()


def ops_with_action(log, action):
    return {entry.split()[1] for entry in log if entry.split()[2] == action}


def test_views_factories_out_and_in_place_reach_the_fallback():
    a = torch.randn(4, 6)
    out = torch.empty(4, 6)

    def region():
        v = a.view(6, 4).t()             # views
        z = torch.zeros(4, 6)            # factories
        e = torch.empty(2, 3)
        torch.add(a, z, out=out)         # out=
        z.add_(1.0)                      # in place
        return v.sum() + e.numel() + z.sum()

    seen = {entry.split()[1] for entry in op_log(region)}
    for name in ("aten::view", "aten::t", "aten::zeros", "aten::add.out", "aten::add_.Tensor", "aten::sum"):
        assert name in seen, (name, sorted(seen))
    # Factories: torch.empty arrives as empty.memory_format, which the tables ignore (FSDP's buffers).
    assert "aten::empty.memory_format" in ops_with_action(op_log(lambda: torch.empty(2, 3)), "ignored")


def test_autograd_stays_above_the_fallback():
    # Ops arrive after autograd recorded them: a region's result still has a grad_fn, and backward works.
    w = torch.randn(3, 3, requires_grad=True)
    inv = hpac.Invocation("full", record_ops=True)
    with inv.region("forward"):
        y = (w @ w).relu().sum()
    assert y.grad_fn is not None
    y.backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()
    assert "forward aten::mm run" in inv.op_log()


def test_profiler_ranges_are_ignored_not_counted():
    def region():
        with torch.autograd.profiler.record_function("hpac-range"):
            torch.randn(2).exp()

    log = op_log(region)
    ignored = ops_with_action(log, "ignored")
    assert ignored & {"profiler::_record_function_enter", "profiler::_record_function_enter_new"}, log
    # Every profiler op that reaches the fallback is ignored (on 1.13 the exit op is a composite kernel handled
    # above the key and never arrives).
    assert all(e.endswith(" ignored") for e in log if " profiler::" in e), log


@pytest.mark.skipif(not _torch_at_least(2, 0), reason=f"torch {torch.__version__} has no _c10d_functional ops")
def test_functional_collectives_are_saved_and_not_reissued_in_the_recompute():
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        x = torch.randn(4, 4)

        def region():
            y = funcol.all_reduce(x * 2, "sum", group)
            return funcol.wait_tensor(y) if hasattr(funcol, "wait_tensor") else y + 0

        inv = hpac.Invocation("selective", record_ops=True)
        with inv.region("forward"):
            forward = region() * 1
        with inv.region("recompute"):
            again = region() * 1
        log = inv.op_log()
        assert "forward _c10d_functional::all_reduce saved" in log, log
        assert "recompute _c10d_functional::all_reduce served" in log, log
        assert "recompute _c10d_functional::wait_tensor served" in log, log
        # The collective and its waits are never run again (2.13 also wraps the result for autograd with
        # _c10d_functional::_wrap_tensor_autograd, which issues nothing and is recomputed).
        for op in ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"):
            ran = [e for e in log if e.startswith("recompute " + op + " ") and not e.endswith(" served")]
            assert not ran, log
        assert_same(forward, again)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not _torch_at_least(2, 4), reason=f"torch {torch.__version__} has no FSDP2 (fully_shard)")
def test_fsdp2_lifecycle_ops_registered_after_the_first_region_are_ignored():
    # Note [Ops registered later]: fsdp::* are defined when FSDP2 is imported, after hpac resolved its tables.
    op_log(lambda: torch.randn(2).exp())  # tables resolved before FSDP2 is imported
    # Registers fsdp::all_gather_copy_in, fsdp::chunk_cat, ...
    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")

    inputs = [torch.randn(3), torch.randn(5)]

    def region():
        torch.ops.fsdp.all_gather_copy_in(inputs, torch.empty(8), [3, 5], 8, 0)

    log = op_log(region)
    assert "forward fsdp::all_gather_copy_in ignored" in log, log
