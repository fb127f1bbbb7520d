"""On a 1-rank Gloo group in this process: every _c10d_functional collective of this torch is saved by the selective
policy and served in the recompute, never issued again (policy/op_tables.cpp kSaveOps; the op names are the ones
torch 2.x dispatches: DTensor's Shard -> Replicate all-gather, coalesced all-reduce and reduce-scatter), and DTensor
parameters under a selective recompute. The multi-rank runs are in test/python/dist."""
import socket

import pytest
import torch
import torch.utils.checkpoint

import hpac
from hpac._loader import _ops_present
from hpac.harness import checkpoint_with

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not _ops_present("_c10d_functional", "all_gather_into_tensor"):
    pytest.skip("no _c10d_functional collectives in this torch", allow_module_level=True)


@pytest.fixture(scope="module")
def group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _collectives(group):
    import torch.distributed._functional_collectives as funcol
    return {
        "_c10d_functional::all_gather_into_tensor": lambda t: funcol.all_gather_single(t, 0, group),
        "_c10d_functional::all_gather_into_tensor_coalesced":
            lambda t: funcol.all_gather_into_tensor_coalesced([t, t * 2], group)[1],
        "_c10d_functional::all_reduce": lambda t: funcol.all_reduce(t, "sum", group),
        "_c10d_functional::all_reduce_coalesced": lambda t: funcol.all_reduce_coalesced([t, t + 1], "sum", group)[0],
        "_c10d_functional::all_to_all_single": lambda t: funcol.all_to_all_single(t, None, None, group),
        "_c10d_functional::reduce_scatter_tensor": lambda t: funcol.reduce_scatter_tensor(t, "sum", 0, group),
        "_c10d_functional::reduce_scatter_tensor_coalesced":
            lambda t: funcol.reduce_scatter_tensor_coalesced([t, t], "sum", [0, 0], group)[0],
    }


@pytest.mark.parametrize("op", sorted(_collectives(None)))
def test_functional_collective_saved_and_served(group, op):
    collective = _collectives(group)[op]

    def block(x):
        h = x.sin()
        got = collective(h.detach())
        got = got.wait() if hasattr(got, "wait") else got  # funcol's AsyncCollectiveTensor: wait_tensor
        # The collective's result is saved by mul for backward: the recompute must produce it again.
        return (h * got).sum()

    x = torch.randn(4, 3, requires_grad=True)
    inv = hpac.Invocation("selective", record_ops=True)
    # hold_saved=False: autograd saves only the region's input and the collective's result, which hpac's frame would
    # hold without a recompute (Note [Frames hold what needs no recompute]); here the recompute must serve it.
    checkpoint_with(inv, block, x, hold_saved=False).backward()
    log = inv.op_log()
    name = op.split("::")[1]
    fwd = [line for line in log if line.startswith("forward ") and f"::{name}" in line.split(" ")[1]]
    rec = [line for line in log if line.startswith("recompute ") and f"::{name}" in line.split(" ")[1]]
    assert fwd and all(line.endswith(" saved") for line in fwd), log
    assert len(rec) == len(fwd) and all(line.endswith(" served") for line in rec), log
    # On one rank every collective is the identity (sums of one): d/dx sum(sin(x) * sin(x)) = 2 sin cos.
    scale = 2.0 if op.endswith("all_gather_into_tensor_coalesced") else 1.0
    expected = x.detach().sin() * x.detach().cos() * scale
    assert (x.grad - expected).abs().max().item() <= 1e-6, (x.grad, expected)


def _clear_dtensor_caches():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()


def test_dtensor_meta_propagation_in_recompute_is_not_counted(group):
    """DTensor's sharding propagation runs meta-device ops (fake tensors) on a cache miss. torch.utils.checkpoint's
    recompute detaches the DTensor parameters autograd saves, which the forward never does, so with a cold cache
    the recompute met aten::empty_strided (meta) the forward never ran: the replay failed (Note [Meta ops are not
    the region's], plugin/fallback.cpp)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))
    block = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False))
    reference = [p.detach().clone() for p in block.parameters()]
    parallelize_module(block, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    x = torch.randn(4, 8, requires_grad=True)
    inv = hpac.Invocation("selective", record_ops=True)
    _clear_dtensor_caches()
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                            context_fn=lambda: (inv.region("forward"), inv.region("recompute")))
    _clear_dtensor_caches()  # the recompute propagates shardings the forward did not (detach) from a cold cache
    out.sum().backward()
    assert inv.stats()["recomputes"] == 1 and inv.stats()["served"] > 0, inv.op_log()
    # Gradient of sum(x W0^T W1^T) with respect to x: ones @ W1 @ W0.
    expected = torch.ones(4, 8) @ reference[1] @ reference[0]
    assert (x.grad - expected).abs().max().item() <= 1e-6
