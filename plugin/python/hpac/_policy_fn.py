"""Bring your own policy: PyTorch's selective-checkpoint API on hpac (the modes and checks behind it; the entry point,
which makes an Invocation, is in _regions.py).

`create_selective_checkpoint_contexts(policy_fn_or_list, allow_cache_entry_mutation=False)` takes what
torch.utils.checkpoint's function of that name takes, and returns hpac's two regions instead of PyTorch's two
dispatch modes:

    context_fn = functools.partial(hpac.create_selective_checkpoint_contexts, policy_fn)   # was torch's
    torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=context_fn)

A list of ops becomes hpac's C++ save list (no Python per op). A policy function is asked once per op in the forward,
after the op ran, with a SelectiveCheckpointContext carrying the op's output, as torch >= 2.13 asks it; hpac records
each answer per (op, occurrence) in C++ and the recompute replays it without asking the function again (Note [Decided
after the op], policy/checkpoint_policy.h; it runs under a pass-through mode: Note [One mode state in both phases]).
Under torch.compile the same call returns PyTorch's modes asking the same function (lists: hpac's traced save list),
so MUST_RECOMPUTE reaches the graph's tags.

Note [Outer dispatch modes see what ran]
hpac's dispatch key sits below the Python key, so a TorchDispatchMode entered around backward (FlopCounterMode,
LoggingTensorMode) would see each recompute op before hpac's fallback serves it from storage, and count matmuls that
never ran. PyTorch's SAC mode is the innermost mode, so outer modes see only what it runs. hpac does the same only when
it matters: a recompute region entered while a Python dispatch mode is active pushes `_ServedOpsMode` as the innermost
mode; for each op it asks hpac (C API, no dispatch) whether the op's kernel runs, and sends the ops that do not run
(served or skipped) straight down to hpac's key with Python dispatch disabled, past the outer modes. Ops that run go
on through the outer modes as before. With no Python mode active nothing is pushed: the hot path is unchanged.
"""
import ctypes
import functools
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.utils.checkpoint
import torch.utils._python_dispatch

from ._loader import _major_minor

_python_dispatch = getattr(torch.utils, "_python_dispatch", None)
_TorchDispatchMode = getattr(_python_dispatch, "TorchDispatchMode", object)
# Python dispatch modes as torch's own SAC uses them (torch 1.13 has modes of an earlier design): torch >= 2.1.
_HAVE_MODES = hasattr(torch._C, "_len_torch_dispatch_stack") and _major_minor(torch.__version__) >= (2, 1)
TorchCheckpointPolicy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)  # torch >= 2.4


class SelectiveCheckpointContext:
    """What a policy function receives as `ctx`, as torch's class of that name: `is_recompute` (always False: the
    function is asked in the forward only) and `op_output` (the op's output)."""

    __slots__ = ("is_recompute", "op_output")

    def __init__(self, *, is_recompute: bool, op_output: Any = None):
        self.is_recompute = is_recompute
        self.op_output = op_output


# torch's own class where it exists, so isinstance checks in users' policies hold.
if hasattr(torch.utils.checkpoint, "SelectiveCheckpointContext"):
    SelectiveCheckpointContext = torch.utils.checkpoint.SelectiveCheckpointContext  # noqa: F811

_ANSWER_NAMES = ("MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE")
_ALLOWED = ("torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE / PREFER_SAVE / MUST_RECOMPUTE / PREFER_RECOMPUTE, "
            "or a bool")


class _Library:
    """libhpac.so's C API (plugin/c_api.h), opened with ctypes: per-op calls without a dispatch."""

    def __init__(self):
        lib = ctypes.CDLL(torch.ops.hpac.library_path())
        lib.hpac_operator.restype = ctypes.c_void_p
        lib.hpac_operator.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.hpac_operator_generation.restype = ctypes.c_ulonglong
        lib.hpac_operator_generation.argtypes = []
        self._generation = lib.hpac_operator_generation
        lib.hpac_invocation_settle_last.restype = ctypes.c_int
        lib.hpac_invocation_settle_last.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.hpac_invocation_runs_in_recompute.restype = ctypes.c_int
        lib.hpac_invocation_runs_in_recompute.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.hpac_last_error.restype = ctypes.c_char_p
        lib.hpac_exclude_key.restype = ctypes.c_int
        lib.hpac_exclude_key.argtypes = [ctypes.c_int]
        self.exclude_key = lib.hpac_exclude_key
        self.settle = lib.hpac_invocation_settle_last
        self.runs = lib.hpac_invocation_runs_in_recompute
        self.last_error = lib.hpac_last_error
        self._operator = lib.hpac_operator
        self._operators: Dict[Any, Optional[int]] = {}
        self._seen = self._generation()

    def operator(self, func) -> Optional[int]:
        """The C API's handle of an OpOverload (cached until an operator is registered or deregistered: Note
        [Operator handles follow registration], plugin/c_api.cpp); None for what is not a registered operator (a
        higher-order operator). A hit costs one dict lookup: a cached address stays valid (refreshed in place by the
        C API); a miss (a new OpOverload, as re-registration makes) first drops the entries of an older generation."""
        try:
            return self._operators[func]
        except KeyError:
            generation = self._generation()
            if generation != self._seen:
                self._operators.clear()
                self._seen = generation
            schema = getattr(func, "_schema", None)
            handle = None
            if schema is not None:
                handle = self._operator(schema.name.encode(), func._overloadname.encode())
            self._operators[func] = handle
            return handle


@functools.lru_cache(maxsize=None)
def _library() -> _Library:
    return _Library()


# hpac's number (policy/checkpoint_policy.h's order) of each CheckpointPolicy it takes: one dict lookup per op.
_CODES = {getattr(TorchCheckpointPolicy, n): i for i, n in enumerate(_ANSWER_NAMES)} if TorchCheckpointPolicy else {}


def answer_code(answer, func, occurrence: int, invocation: int) -> int:
    """hpac's CheckpointPolicy number for what a policy function returned; a bool means MUST_SAVE / PREFER_RECOMPUTE,
    as torch's _policy_from_bool. Anything else is refused naming the op and occurrence (CPU offload included:
    eager hpac neither offloads nor silently recomputes what was asked to be offloaded)."""
    if answer is True or answer is False:
        return 0 if answer else 3
    code = _CODES.get(answer) if isinstance(answer, TorchCheckpointPolicy or ()) else None
    if code is not None:
        return code
    name = getattr(answer, "name", None)
    where = f"{func} (occurrence {occurrence} of this op in invocation {invocation})"
    if name in ("MUST_CPU_OFFLOAD", "PREFER_CPU_OFFLOAD"):
        raise RuntimeError(f"hpac: policy_fn answered CheckpointPolicy.{name} for {where}; hpac does not offload to "
                           f"the CPU. Allowed: {_ALLOWED}. To offload what the region keeps, wrap the checkpoint "
                           "in torch.autograd.graph.save_on_cpu() (hpac's kept tensors go through it)")
    raise TypeError(f"hpac: policy_fn returned {answer!r} ({type(answer).__name__}) for {where}; allowed: {_ALLOWED}")


# The ops torch's SAC never asks its policy about (SAC_IGNORED_OPS), so stateful policies count as there.
_TORCH_IGNORED = frozenset(getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", ())) or frozenset(
    [torch.ops.aten.detach.default, torch.ops.prim.device.default])


class _PolicyFnMode(_TorchDispatchMode):
    """The forward of a policy_fn region: runs each op (through outer modes and hpac's fallback, which keeps its
    outputs provisionally), then asks the policy function and settles the answer in C++."""

    def __init__(self, policy_fn: Callable, invocation):
        super().__init__()
        self._policy_fn = policy_fn
        self._invocation_id = invocation.id  # read once: a custom-class call costs microseconds
        self._address = invocation._handle.address()
        self._lib = _library()
        self._calls: Dict[Any, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = {} if kwargs is None else kwargs
        out = func(*args, **kwargs)
        if func in _TORCH_IGNORED:
            return out
        occurrence = self._calls[func]
        self._calls[func] = occurrence + 1
        # Ops the function runs are not the region's (torch's SAC runs it with its own mode popped): hpac's key is
        # hidden meanwhile.
        excluded = self._lib.exclude_key(1)
        try:
            answer = self._policy_fn(SelectiveCheckpointContext(is_recompute=False, op_output=out), func,
                                     *args, **kwargs)
        except Exception as e:
            raise RuntimeError(f"hpac: policy_fn raised {type(e).__name__} for {func} (occurrence {occurrence} "
                               f"of this op in invocation {self._invocation_id}): {e}") from e
        finally:
            self._lib.exclude_key(excluded)
        code = answer_code(answer, func, occurrence, self._invocation_id)
        op = self._lib.operator(func)
        if op is not None and self._lib.settle(self._address, op, code) < 0:
            raise RuntimeError(self._lib.last_error().decode())
        return out


class _ServedOpsMode(_TorchDispatchMode):
    """The recompute's innermost mode while outer dispatch modes are active (Note [Outer dispatch modes see what
    ran]): ops hpac serves or skips go straight to hpac's key, unseen by the outer modes."""

    def __init__(self, invocation):
        super().__init__()
        self._address = invocation._handle.address()
        self._lib = _library()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = {} if kwargs is None else kwargs
        op = self._lib.operator(func)
        # Tensor subclasses must reach their own __torch_dispatch__; only plain tensors go past the Python key.
        if op is not None and all(t is torch.Tensor for t in types) and not self._lib.runs(self._address, op):
            with torch._C._DisableTorchDispatch():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


class _ModeStateMode(_TorchDispatchMode):
    """A policy function's recompute with no outer mode around it: the mode is only there so that torch's composite
    ops decompose as in the forward (Note [One mode state in both phases], _regions.py); each op goes on at once."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def outer_modes_active() -> bool:
    """Whether a Python TorchDispatchMode is active on this thread."""
    return _HAVE_MODES and torch._C._len_torch_dispatch_stack() > 0


def require_modes(what: str) -> None:
    if not _HAVE_MODES:
        raise RuntimeError(f"hpac: {what} needs torch >= 2.1 (Python dispatch modes); this torch is "
                           f"{torch.__version__}. Use a kind name or a save list of op names")


def _op_name(op) -> Optional[str]:
    """hpac's save-list name of one list entry: 'aten::mm.default' for an OpOverload, 'aten::mm' (every overload)
    for an OpOverloadPacket, a string as given; None for a higher-order operator (it never reaches hpac's key)."""
    if isinstance(op, str):
        return op
    if isinstance(op, torch._ops.OpOverload):
        return f"{op._schema.name}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, getattr(torch._ops, "HigherOrderOperator", ())):
        return None
    raise ValueError(f"hpac: a save list holds ops: torch.ops OpOverloads (torch.ops.aten.mm.default), "
                     f"OpOverloadPackets (torch.ops.aten.mm: every overload), higher-order operators, or op names "
                     f"('aten::mm', 'aten::max.dim'); got {op!r} of type {type(op).__name__}")


def save_list_names(ops: Sequence) -> List[str]:
    """The op names of a save list (see _op_name); higher-order operators are left out."""
    return [n for n in (_op_name(op) for op in ops) if n is not None]


def checked_policy_fn(policy_fn: Callable) -> Callable:
    """policy_fn for torch's own SAC modes (under torch.compile): the same answers, refused as in eager."""
    counts: Dict[Any, int] = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        occurrence = counts[op]
        counts[op] += 1
        answer = policy_fn(ctx, op, *args, **kwargs)
        return TorchCheckpointPolicy[_ANSWER_NAMES[answer_code(answer, op, occurrence, -1)]]

    return policy


PolicyFnOrList = Union[Callable, List, tuple]
