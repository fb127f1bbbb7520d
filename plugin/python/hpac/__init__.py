"""hpac from Python: selective activation checkpointing run by libhpac.so's dispatcher fallback.

    import hpac                                    # loads libhpac.so ($HPAC_LIBRARY, the package's, or the repo's build/)
    y = hpac.checkpoint(block, x, policy="selective")              # torch 1.13+: hpac's own non-reentrant checkpoint
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                          context_fn=hpac.context_fn("selective"))   # torch >= 2.1, also compiled
    hpac.checkpoint_wrapper(layer, policy="selective")              # in place; state_dict keys unchanged
    context_fn = functools.partial(hpac.create_selective_checkpoint_contexts, policy_fn)  # torch's SAC API, on hpac
    policy = hpac.budget(0.3)                      # memory budget: 30% of what the region keeps under off
    y = hpac.checkpoint(block, x, policy=policy)   # (or context_fn(policy), checkpoint_wrapper(layer, policy=policy))
    policy.status()                                # {'stage': 'planned', 'profiles': 1, 'kept_bytes': ..., ...}

The policy runs in C++ (built-in selective rules, a save list, a memory budget, or recompute everything); Python only marks
where a region starts and ends. A Python policy_fn (torch's SAC API) is asked once per op in the forward; its answers
are recorded and replayed in C++ (_policy_fn.py). Under torch.compile the same C++ policy tags the traced graph and the compiler
recomputes (_compile.py). Errors raised by hpac (replay mismatch, extra backward, mutated cache, key already owned)
arrive as RuntimeError with hpac's message.

One job per private module: _loader (the library and its process-wide ops), _budget, _regions (Invocation,
context_fn), _compile (torch.compile), _frame (hpac.checkpoint), _explain, _wrap (checkpoint_wrapper), _policy_fn
(torch's SAC API: policy functions and op lists), _field_policies (PolicySpec: C++ rule kinds with parameters),
_target (a whole-step memory target: fit_memory_target).
"""
from ._budget import Budget, budget, roofline
from ._explain import EXPLAIN_MODES, Explanation, explain
from ._field_policies import PolicySpec, torchtitan_mm_shapes
from ._frame import checkpoint
from ._loader import (built_for_torch, cpu_tensor_memory_stats, dispatch_key, fallback_status, global_stats, load,
                      memory_stats, memory_tracked, reset_cpu_tensor_peak, reset_global_stats, reset_peak_memory,
                      track_memory, version)
from . import _policy_fn as _policy_fn_module
from ._policy_fn import SelectiveCheckpointContext
from ._regions import Invocation, InvocationTally, context_fn, create_selective_checkpoint_contexts
from ._wrap import checkpoint_wrapper, unwrap_checkpoint
from ._target import LayerPlan, MemoryTarget, MemoryTargetError, fit_memory_target

__all__ = [
    "__version__", "load", "built_for_torch", "version", "dispatch_key", "fallback_status", "global_stats",
    "reset_global_stats", "Invocation", "InvocationTally", "Budget", "budget", "context_fn", "checkpoint",
    "checkpoint_wrapper", "unwrap_checkpoint", "track_memory", "memory_tracked", "cpu_tensor_memory_stats",
    "reset_cpu_tensor_peak", "explain", "Explanation", "EXPLAIN_MODES", "roofline",
    "create_selective_checkpoint_contexts", "SelectiveCheckpointContext", "PolicySpec", "torchtitan_mm_shapes",
    "fit_memory_target", "MemoryTarget", "MemoryTargetError", "LayerPlan",
]

load()
_policy_fn_module._library()  # the C API's per-op entry points, opened once, outside any region
# The version of the libhpac serving torch.ops.hpac (CMakeLists.txt's project version; the wheel's too).
__version__ = version()
