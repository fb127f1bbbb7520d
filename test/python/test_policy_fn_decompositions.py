"""A policy function's region meets the same op sequence in forward and recompute (Note [One mode state in both
phases], plugin/python/hpac/_regions.py): torch's composite ops decompose by whether a dispatch mode is active
(`reshape` becomes `view` under one and `_reshape_alias` without), and the forward runs under hpac's policy mode, so
the recompute runs under a mode too. Before, a reshape ahead of a saved op failed in backward ("aten::_reshape_alias
... is not in storage"), e.g. on every transformers Qwen3-MoE layer (SDPA's output is reshaped before o_proj)."""
import functools

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(_major_minor(torch.__version__) < (2, 1),
                                reason=f"policy functions need torch >= 2.1 (this is torch {torch.__version__})")


def save_mm(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def problem():
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(16, 16, requires_grad=True)
    # reshapes (a transposed view and a contiguous one) between two saved matmuls
    fn = lambda t: ((t @ w).view(2, 8, 16).transpose(0, 1).reshape(8, 2, 16).sin().reshape(16, 16) @ w).cos()  # noqa
    return fn, x, w


def grads(run):
    fn, x, w = problem()
    run(fn, x).sum().backward()
    return [x.grad, w.grad]


@pytest.mark.parametrize("frame", ["hpac.checkpoint", "torch.utils.checkpoint"])
def test_reshape_before_a_saved_op(frame):
    ref = grads(lambda fn, x: fn(x))
    if frame == "hpac.checkpoint":
        got = grads(lambda fn, x: hpac.checkpoint(fn, x, policy=save_mm))
    else:
        context_fn = functools.partial(hpac.create_selective_checkpoint_contexts, save_mm)
        got = grads(lambda fn, x: torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False,
                                                                    context_fn=context_fn))
    assert_same(got, ref)
