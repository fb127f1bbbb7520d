"""Router drift, injected (CPU kernels are deterministic): DriftingRouter, entered around backward only, hands every
topk the recompute runs other scores, as a router whose logits moved between forward and recompute would (bf16
kernels, a tie broken another way). It must not change the region's op sequence, so it dispatches only ops that hpac
ignores (aten::empty_like, aten::copy_): the scores are replaced by random ones made before backward, one tensor per
shape a dry forward (topk_shapes) saw."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

TOPK = torch.ops.aten.topk.default


class _Shapes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is TOPK:
            self.shapes.add((tuple(args[0].shape), args[0].dtype))
        return func(*args, **(kwargs or {}))


def topk_shapes(forward):
    """The (shape, dtype) of every topk input of forward(), run without grad (no checkpoint region is entered)."""
    with torch.no_grad(), _Shapes() as seen:
        forward()
    return seen.shapes


class DriftingRouter(TorchDispatchMode):
    def __init__(self, shapes, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.scores = {s: torch.rand(s[0], generator=g, dtype=s[1]) for s in shapes}
        self.moved = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is TOPK and (tuple(args[0].shape), args[0].dtype) in self.scores:
            other = torch.empty_like(args[0])
            other.copy_(self.scores[(tuple(args[0].shape), args[0].dtype)])
            args = (other,) + tuple(args[1:])
            self.moved += 1
        return func(*args, **(kwargs or {}))
