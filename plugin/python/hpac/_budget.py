"""The memory-budget policy of one region (policy/budget_policy.h), seen from Python."""
import itertools
import os
import weakref
from typing import Dict, List, Optional, Union

import torch

from ._region_options import RegionOptions


class Budget:
    """The memory-budget policy of one region (policy/budget_policy.h).

    The first `profile_invocations` checkpoint calls run as a profile (everything recomputed, every op's kernel time
    and output bytes measured), a knapsack picks the outputs to keep within the budget at the least recompute time,
    and later calls replay that plan by (op, occurrence). A call whose op sequence differs from the plan (dynamic
    shapes, MoE routing) takes the fixed selective policy from the first differing op and the region profiles again;
    after `max_replans` such changes it keeps the fixed selective policy for good, with one warning.

    The object holds the region: pass the same Budget to every call of one region (one layer's checkpoint, step
    after step; or layers of identical structure), a new one per region otherwise. A Budget plans from eager
    profiles, so it cannot decide a region that torch.compile traces (docs/python.md, "Under torch.compile").
    """

    __slots__ = ("_region", "fraction", "bytes", "plan", "cost", "_number", "__weakref__")
    _numbers = itertools.count(1)
    _live: "weakref.WeakValueDictionary[int, Budget]" = weakref.WeakValueDictionary()

    def __init__(self, fraction: Optional[float] = None, *, bytes: Optional[int] = None, profile_invocations: int = 1,
                 max_replans: int = 2, plan: Optional[Union[str, os.PathLike]] = None, skip_dead: bool = True,
                 cost: str = "measured"):
        for name, value, kind in (("fraction", fraction, (int, float)), ("bytes", bytes, int),
                                  ("profile_invocations", profile_invocations, int),
                                  ("max_replans", max_replans, int)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise TypeError(f"hpac.budget: {name} {value!r} is a {type(value).__name__}; allowed: "
                                f"{'a number in [0, 1]' if name == 'fraction' else 'an int'}")
        if not isinstance(cost, str):
            raise TypeError(f"hpac.budget: cost {cost!r} is a {type(cost).__name__}; allowed: 'measured' or "
                            "'estimated'")
        self.fraction = None if fraction is None else float(fraction)
        self.bytes = bytes
        self.plan = None if plan is None else os.fspath(plan)
        text = None
        if self.plan is not None:
            if fraction is not None or bytes is not None:
                raise ValueError(f"hpac.budget: plan={self.plan!r} carries its budget; give either plan= or a "
                                 "fraction / bytes, not both")
            with open(self.plan, encoding="utf-8") as f:  # a missing file: FileNotFoundError naming it
                text = f.read()
        # Checked in C++ (policy/budget_policy.h makeBudgetSpec, BudgetRegion::fromPlanText): exactly one of
        # fraction / bytes, ranges; a plan's syntax and ops.
        self._region = torch.classes.hpac.BudgetRegion(self.fraction, bytes, profile_invocations, max_replans,
                                                       bool(skip_dead), text, self.plan or "", cost)
        self.cost = cost
        if text is None:  # Note [The roofline is measured outside regions]
            roofline("cpu")
            if torch.cuda.is_available():
                roofline("cuda")
        # A number that context_fn's partial can hold as a constant (Note [context_fn under torch.compile]).
        self._number = next(Budget._numbers)
        Budget._live[self._number] = self

    @classmethod
    def _by_number(cls, number: int) -> "Budget":
        budget = cls._live.get(number)
        if budget is None:
            raise RuntimeError(f"hpac: Budget {number} of a context_fn no longer exists; keep the Budget alive as "
                               "long as the regions it serves")
        return budget

    def save_plan(self, path: Union[str, os.PathLike]) -> None:
        """Writes the region's plan (after its profile) to `path` (Note [Plan files], policy/plan_file.h);
        hpac.budget(plan=path) replays it in the same region, on the same shapes, without profiling.

        Args:
            path: the file to write.
        """
        text = self._region.plan_text()
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(text)

    def _invocation(self, allow_cache_entry_mutation: bool, options: RegionOptions):
        """The C++ invocation of one call of this region, with its RegionOptions (_regions.py)."""
        return self._region.invocation(bool(allow_cache_entry_mutation), *options.flat())

    @property
    def stage(self) -> str:
        """'profiling', 'planned' or 'fallback (fixed selective policy)'."""
        return self._region.stage()

    def status(self) -> Dict[str, Union[int, float, str]]:
        """{'stage', 'profiles', 'replans', 'profiled_ops', 'budget_bytes', 'kept_bytes', 'total_bytes', 'off_bytes',
        'groups', 'kept_groups', 'planned_ops', 'saved_ops', 'skipped_ops', 'saved_micros', 'total_micros',
        'skipped_micros', 'recompute_micros'}: the plan's fields are those of the last plan (zero before the first);
        skipped: ops the recompute need not run (Note [Dead ops are skipped], policy/budget_plan.h);
        recompute_micros: the recompute's predicted time, host time included, up to where it stops (Note [The
        recompute's fixed cost]; -1 without dataflow)."""
        d = dict(self._region.status())
        d["stage"] = self._region.stage()
        d["saved_micros"], d["total_micros"], d["skipped_micros"], d["recompute_micros"] = self._region.micros()
        return d

    def profile(self) -> List[Dict[str, Union[int, float, str]]]:
        """The last complete profile, one dict per counted op of the forward: 'op', 'occurrence', 'micros' (what
        the plan weighs its recompute by: the median measured time, or the estimate under cost='estimated'),
        'estimated_micros', 'flops' and 'bytes_moved' (Note [Estimated op costs], replay/op_cost.h). Empty before
        the first profile finished."""
        keys = ("op", "occurrence", "micros", "estimated_micros", "flops", "bytes_moved")
        return [dict(zip(keys, row)) for row in zip(*self._region.profile())]

    def __repr__(self):
        what = (f"plan={self.plan!r}" if self.plan is not None else
                f"fraction={self.fraction}" if self.fraction is not None else f"bytes={self.bytes}")
        return f"hpac.Budget({what}, stage={self.stage!r})"


def budget(fraction: Optional[float] = None, *, bytes: Optional[int] = None, profile_invocations: int = 1,
           max_replans: int = 2, plan: Optional[Union[str, os.PathLike]] = None, skip_dead: bool = True,
           cost: str = "measured") -> Budget:
    """A memory-budget policy, one per region.

    Use it as `policy=` of hpac.checkpoint / hpac.context_fn / hpac.Invocation / hpac.checkpoint_wrapper.

    Args:
        fraction: in [0, 1] of what the region keeps with checkpointing off (the outputs autograd saves: 0 = full,
            1 = as many bytes as off keeps).
        bytes: the budget in bytes per call of the region, instead of a fraction.
        profile_invocations: how many calls profile before the plan is made.
        max_replans: how many op-sequence changes re-plan before the fixed selective policy is kept for good.
        plan: a file Budget.save_plan wrote (replayed without a profile; a region it does not match is an error).
        skip_dead: False keeps the recompute from skipping ops nothing backward needs (Note [Dead ops are skipped]):
            for code that reads a floating-point op's output values inside the region without an aten op (numpy(),
            tolist() on CPU tensors, data_ptr in an extension), which would see a skipped op's uninitialised output.
            Ops with integer or bool results (counts, indices, masks: the usual tolist() split sizes) always run.
        cost: what the plan weighs each op's recompute by (Note [Estimated op costs], replay/op_cost.h): "measured",
            the profiled kernel time (the median over profile_invocations forwards; synchronised with the device on
            accelerators), or "estimated", from the op's flops and bytes on the device's roofline (measured once per
            process), the same in every run on the same shapes.
    """
    return Budget(fraction, bytes=bytes, profile_invocations=profile_invocations, max_replans=max_replans, plan=plan,
                  skip_dead=skip_dead, cost=cost)


def roofline(device: str = "cpu") -> Dict[str, float]:
    """The roofline the estimated costs of ops on `device` use (Note [Estimated op costs], replay/op_cost.h):
    {'flops_per_us', 'bytes_per_us'}, measured once per device type and process, or pinned by HPAC_ROOFLINE.

    Args:
        device: a device string ("cpu", "cuda", "cuda:0").
    """
    flops, bytes_ = torch.ops.hpac.roofline(device)
    return {"flops_per_us": flops, "bytes_per_us": bytes_}
