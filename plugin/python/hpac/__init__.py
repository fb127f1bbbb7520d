"""hpac from Python: selective activation checkpointing run by libhpac.so's dispatcher fallback.

    import hpac                                    # loads libhpac.so ($HPAC_LIBRARY, the package's, or the repo's build/)
    y = hpac.checkpoint(block, x, policy="selective")              # torch 1.13+: hpac's own non-reentrant checkpoint
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                          context_fn=hpac.context_fn("selective"))   # torch >= 2.1
    hpac.checkpoint_wrapper(layer, mode="selective")                # in place; state_dict keys unchanged
    policy = hpac.budget(0.3)                      # memory budget: 30% of what the region keeps under off
    y = hpac.checkpoint(block, x, policy=policy)   # (or context_fn(policy), checkpoint_wrapper(layer, mode=policy))
    policy.status()                                # {'stage': 'planned', 'profiles': 1, 'kept_bytes': ..., ...}

The policy runs in C++ (built-in selective rules, a save list, a memory budget, or recompute everything); Python only marks
where a region starts and ends. Errors raised by hpac (replay mismatch, extra backward, mutated cache, key
already owned) arrive as RuntimeError with hpac's message.
"""
import contextlib
import functools
import json
import os
import threading

import torch

__all__ = [
    "__version__", "load", "built_for_torch", "version", "dispatch_key", "fallback_status", "global_stats", "reset_global_stats",
    "Invocation", "Budget", "budget", "context_fn", "checkpoint", "checkpoint_with", "checkpoint_wrapper",
    "unwrap_checkpoint", "track_memory", "memory_stats", "reset_peak_memory", "explain", "Explanation", "EXPLAIN_MODES",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
# Where pip install puts the library (pyproject.toml, tools/cmake/hpacInstall.cmake).
_PACKAGED = os.path.join(_HERE, "lib", "libhpac.so")
_load_lock = threading.Lock()


def _ops_present(namespace="hpac", op="version"):
    """Whether torch.ops.<namespace>.<op> is registered (its library loaded)."""
    try:
        getattr(getattr(torch.ops, namespace), op)
        return True
    except (AttributeError, RuntimeError):
        return False


_MARKER = b"hpac-built-for-torch="


def _major_minor(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def built_for_torch(path):
    """The torch version the libhpac.so at `path` was compiled against, read from the file without loading it
    (None if the file carries no marker: a build older than the marker)."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(_MARKER)
    if at < 0:
        return None
    end = data.find(b";", at)
    return data[at + len(_MARKER):end].decode("ascii", "replace")


def _check_same_torch(path):
    # Note [One torch per libhpac] (plugin/registration.cpp): a libhpac built for another torch must not be
    # dlopen'ed at all, since the loader may pull a second libtorch into the process, which crashes.
    built = built_for_torch(path)
    if built is not None and _major_minor(built) != _major_minor(torch.__version__):
        raise RuntimeError(
            f"hpac: '{path}' was built for torch {built} but this Python runs torch {torch.__version__}; it was not "
            "loaded. Build hpac against this torch (HPAC_TORCH_PYTHON=<this python> tools/build.sh; tools/build.sh "
            "--torch debian for Debian's) or point HPAC_LIBRARY at a libhpac.so built for it")


def _default_library():
    """The package's own libhpac.so when hpac was installed with pip (hpac/lib/libhpac.so); otherwise, in a
    development checkout, the repository's build for the running torch: build/ (tools/build.sh's default, pip torch)
    or build-torch<major>.<minor>/ (tools/build.sh --torch debian), whichever was built for this torch."""
    if os.path.exists(_PACKAGED):
        return _PACKAGED
    major, minor = _major_minor(torch.__version__)
    candidates = [os.path.join(_REPO, folder, "plugin", "libhpac.so")
                  for folder in ("build", f"build-torch{major}.{minor}")]
    present = [c for c in candidates if os.path.exists(c)]
    for c in present:
        built = built_for_torch(c)
        if built is None or _major_minor(built) == (major, minor):
            return c
    return present[0] if present else candidates[0]


def load(path=None):
    """Makes torch.ops.hpac / torch.classes.hpac available and returns the path of the library serving them.

    Nothing is loaded when they are already there (LD_PRELOAD, or an earlier load). Otherwise the library is
    `path`, else $HPAC_LIBRARY, else the package's (hpac/lib/libhpac.so, after pip install), else the repository's
    build for this torch (build/plugin/libhpac.so or build-torch<version>/plugin/libhpac.so). A library built for another torch release is refused with a
    RuntimeError naming both versions, before it is loaded (also when `path` is given while hpac is loaded).
    """
    with _load_lock:
        if path is not None and os.path.exists(path):
            _check_same_torch(path)
        if not _ops_present():
            candidate = path or os.environ.get("HPAC_LIBRARY") or _default_library()
            if not os.path.exists(candidate):
                raise RuntimeError(
                    f"hpac: libhpac.so not found at '{candidate}'; install the package (pip install "
                    "--no-build-isolation .), build it (tools/build.sh), or set HPAC_LIBRARY to its path")
            _check_same_torch(candidate)
            torch.ops.load_library(candidate)
            if not _ops_present():
                raise RuntimeError(f"hpac: '{candidate}' was loaded but registered no ops; its message on stderr "
                                   "says why (for example a torch version it was not built for)")
        return torch.ops.hpac.library_path()


def version():
    return torch.ops.hpac.version()


def dispatch_key():
    return torch.ops.hpac.dispatch_key()


def fallback_status():
    return torch.ops.hpac.fallback_status()


def global_stats():
    return dict(torch.ops.hpac.global_stats())


def reset_global_stats():
    torch.ops.hpac.reset_global_stats()


def track_memory():
    """Counts CPU tensor bytes from now on (wraps the CPU allocator once for the whole process)."""
    torch.ops.hpac.track_memory()


def memory_stats():
    """{'current_bytes', 'peak_bytes', 'allocations'} of CPU tensors allocated since track_memory()."""
    return dict(torch.ops.hpac.memory_stats())


def reset_peak_memory():
    torch.ops.hpac.reset_peak_memory()


class Budget:
    """The memory-budget policy of one region (policy/budget_policy.h): the first `profile_invocations` checkpoint
    calls run as a profile (everything recomputed, every op's kernel time and output bytes measured), a knapsack
    picks the outputs to keep within the budget at the least recompute time, and later calls replay that plan by
    (op, occurrence). A call whose op sequence differs from the plan (dynamic shapes, MoE routing) takes the fixed
    selective policy from the first differing op and the region profiles again; after `max_replans` such changes it
    keeps the fixed selective policy for good, with one warning.

    The object holds the region: pass the same Budget to every call of one region (one layer's checkpoint, step
    after step; or layers of identical structure), a new one per region otherwise.
    """

    __slots__ = ("_region", "fraction", "bytes", "plan")

    def __init__(self, fraction=None, *, bytes=None, profile_invocations=1, max_replans=2, plan=None, skip_dead=True):
        for name, value, kind in (("fraction", fraction, (int, float)), ("bytes", bytes, int),
                                  ("profile_invocations", profile_invocations, int),
                                  ("max_replans", max_replans, int)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise TypeError(f"hpac.budget: {name} {value!r} is a {type(value).__name__}; allowed: "
                                f"{'a number in [0, 1]' if name == 'fraction' else 'an int'}")
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
                                                       bool(skip_dead), text, self.plan or "")

    def save_plan(self, path):
        """Writes the region's plan (after its profile) to `path` (Note [Plan files], policy/budget_policy.h);
        hpac.budget(plan=path) replays it in the same region, on the same shapes, without profiling."""
        text = self._region.plan_text()
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(text)

    def _invocation(self, allow_cache_mutation):
        return self._region.invocation(bool(allow_cache_mutation))

    @property
    def stage(self):
        """'profiling', 'planned' or 'fallback (fixed selective policy)'."""
        return self._region.stage()

    def status(self):
        """{'stage', 'profiles', 'replans', 'profiled_ops', 'budget_bytes', 'kept_bytes', 'total_bytes', 'off_bytes', 'groups',
        'kept_groups', 'planned_ops', 'saved_ops', 'skipped_ops', 'saved_micros', 'total_micros', 'skipped_micros'}:
        the plan's fields are those of the last plan (zero before the first); skipped: ops the recompute need not
        run (Note [Dead ops are skipped], policy/budget_plan.h)."""
        d = dict(self._region.status())
        d["stage"] = self._region.stage()
        d["saved_micros"], d["total_micros"], d["skipped_micros"] = self._region.micros()
        return d

    def __repr__(self):
        what = (f"plan={self.plan!r}" if self.plan is not None else
                f"fraction={self.fraction}" if self.fraction is not None else f"bytes={self.bytes}")
        return f"hpac.Budget({what}, stage={self.stage!r})"


def budget(fraction=None, *, bytes=None, profile_invocations=1, max_replans=2, plan=None, skip_dead=True):
    """A memory-budget policy: `fraction` in [0, 1] of what the region keeps with checkpointing off (the outputs
    autograd saves: 0 = full, 1 = as many bytes as off keeps), or `bytes` per call of the region, or `plan`, a
    file Budget.save_plan wrote (replayed without a profile; a region it does not match is an error).
    skip_dead=False keeps the recompute from skipping ops nothing backward needs (Note [Dead ops are skipped]):
    for code that reads an op's output values inside the region without an aten op (numpy(), tolist() on CPU
    tensors, data_ptr in an extension), which would see a skipped op's uninitialised output. Returns a
    Budget (one per region); use it as `policy=` of hpac.checkpoint / hpac.context_fn / hpac.Invocation, or
    `mode=` of hpac.checkpoint_wrapper."""
    return Budget(fraction, bytes=bytes, profile_invocations=profile_invocations, max_replans=max_replans, plan=plan,
                  skip_dead=skip_dead)


def _policy_kind(policy):
    """policy: a kind name ("selective", "full", "save_all", ...; parsed and checked in C++, policy/policy_kind.h),
    None (= "full"), or an iterable of op names (a save list). A Budget is handled by its callers."""
    if policy is None:
        return "full", []
    if isinstance(policy, str):
        return policy, []
    names = list(policy)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"hpac: a save list holds op names (str), got {names!r}")
    return "save_list", names


class _Region:
    """Context manager for one phase of an Invocation. Re-enterable: torch.utils.checkpoint enters the same
    recompute context again when a graph is backwarded twice (retain_graph); hpac then reports the entries
    already served."""

    __slots__ = ("_invocation", "_phase", "_reporting")

    def __init__(self, invocation, phase):
        self._invocation = invocation
        self._phase = phase
        self._reporting = None

    def __enter__(self):
        handle = self._invocation._handle
        handle.enter(self._phase)
        if self._phase == "forward" and handle.watches_saved():
            self._reporting = _report_saved(self._invocation)
        return self._invocation

    def __exit__(self, exc_type, exc, tb):
        if self._reporting is not None:
            reporting, self._reporting = self._reporting, None
            reporting()
        # An exception (torch's early stop of a recompute, an error) ends the phase unfinished: hpac then
        # releases saved outputs the recompute never asked for without warning about them.
        self._invocation._handle.exit(exc_type is None)
        return False


_TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.0


def _report_saved(invocation):
    """While a budget profile's forward, or one that may skip ops, runs: every tensor autograd saves is reported
    to hpac (Note [What off keeps], policy/budget_plan.h; Note [Skips are verified], replay/invocation.cpp), then
    handed to the checkpoint's own pack hook. Returns the function that stops
    reporting. Where torch can say which hooks are on top (>= 2.0: torch.utils.checkpoint's, or hpac.checkpoint's
    frame), they are wrapped; on 1.13 hpac.checkpoint's frame reports itself (_Frame.pack)."""
    handle = invocation._handle
    if _TOP_HOOKS is None:
        invocation._note_saved = handle.note_saved
        return lambda: setattr(invocation, "_note_saved", None)
    top = _TOP_HOOKS(False)
    pack, unpack = top if top is not None else (lambda t: t, lambda t: t)

    def report(tensor):
        handle.note_saved(tensor)
        return pack(tensor)

    hooks = torch.autograd.graph.saved_tensors_hooks(report, unpack)
    hooks.__enter__()
    return lambda: hooks.__exit__(None, None, None)


class Invocation:
    """One checkpoint call: the C++ Invocation (op counters, storage, stats) and its two regions.

    record_ops=True keeps a log of every op the fallback handed to it (op_log()), for tests and explain tools.
    """

    def __init__(self, policy="selective", allow_cache_mutation=False, record_ops=False, explain=False):
        self._note_saved = None  # set while a budget profile runs on torch 1.13 (_report_saved)
        if isinstance(policy, Budget):
            self._handle = policy._invocation(allow_cache_mutation)
        else:
            kind, names = _policy_kind(policy)
            self._handle = torch.classes.hpac.Invocation(kind, names, bool(allow_cache_mutation))
        if record_ops:
            self._handle.record_ops(True)
        if explain:
            self._handle.explain()

    @property
    def id(self):
        return self._handle.id()

    def stats(self):
        return dict(self._handle.stats())

    def stored_entries(self):
        return self._handle.stored_entries()

    def op_log(self):
        """['forward aten::mm saved', 'recompute aten::mm served', ...] when created with record_ops=True."""
        return list(self._handle.op_log())

    def region(self, phase):
        """Every aten op run inside goes through hpac (phase: 'forward' or 'recompute')."""
        return _Region(self, phase)


def context_fn(policy="selective", allow_cache_mutation=False):
    """For torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...) on torch >= 2.1.

    Returns a callable that, per checkpoint call, creates one Invocation and returns its (forward, recompute)
    context managers. With a Budget, every call shares its region (profile once, then replay the plan).
    """
    if not isinstance(policy, Budget):
        kind, names = _policy_kind(policy)
        torch.classes.hpac.Invocation(kind, names, False)  # validate now (in C++), not inside backward

    def make_contexts():
        inv = Invocation(policy, allow_cache_mutation)
        return inv.region("forward"), inv.region("recompute")

    return make_contexts


def _cuda_devices(tensors):
    return sorted({t.device.index for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})


class _Placeholder:
    __slots__ = ("frame", "index")

    def __init__(self, frame, index):
        self.frame = frame
        self.index = index


class _Frame:
    """State of one hpac.checkpoint call (the torch 1.13 path); owned by the placeholders in the graph."""

    def __init__(self, fn, args, kwargs, invocation, preserve_rng_state, determinism_check):
        self.fn = fn
        self.kwargs = kwargs
        self.args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        self.requires_grad = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        self.invocation = invocation
        self.determinism_check = determinism_check
        self.meta = []
        self.recomputed = {}
        self.lock = threading.Lock()
        self.devices = _cuda_devices(args) if preserve_rng_state else None
        if preserve_rng_state:
            self.cpu_rng = torch.get_rng_state()
            self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.devices]

    def pack(self, tensor):
        note = getattr(self.invocation, "_note_saved", None)
        if note is not None:
            note(tensor)
        self.meta.append((tensor.shape, tensor.dtype, tensor.device))
        return _Placeholder(self, len(self.meta) - 1)

    def unpack(self, placeholder):
        with self.lock:
            if placeholder.index not in self.recomputed:
                self._recompute()
            return self.recomputed.pop(placeholder.index)

    @contextlib.contextmanager
    def _forward_rng(self):
        if self.devices is None:
            yield
            return
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu_rng)
            for d, state in zip(self.devices, self.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            yield

    def _recompute(self):
        inputs = [a.detach().requires_grad_(rg) if isinstance(a, torch.Tensor) else a
                  for a, rg in zip(self.args, self.requires_grad)]
        collected = []

        def pack(tensor):
            collected.append(tensor.detach())
            return None

        def unpack(_):
            raise RuntimeError("hpac: a tensor saved during a checkpoint recompute was unpacked")

        with self._forward_rng(), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, unpack), self.invocation.region("recompute"):
            self.fn(*inputs, **self.kwargs)
        if self.determinism_check:
            self._check(collected)
        self.recomputed = dict(enumerate(collected))

    def _check(self, collected):
        inv = self.invocation.id
        if len(collected) != len(self.meta):
            raise RuntimeError(
                f"hpac: checkpoint invocation {inv} is not deterministic: the forward saved {len(self.meta)} "
                f"tensors for backward but the recompute saved {len(collected)}. The checkpointed function must run "
                "the same ops in backward as in forward.")
        for i, (t, (shape, dtype, device)) in enumerate(zip(collected, self.meta)):
            if t.shape != shape or t.dtype != dtype or t.device != device:
                raise RuntimeError(
                    f"hpac: checkpoint invocation {inv} is not deterministic: saved tensor #{i} was "
                    f"{tuple(shape)} {dtype} on {device} in forward but {tuple(t.shape)} {t.dtype} on {t.device} "
                    "in the recompute.")


def checkpoint(fn, *args, policy="selective", preserve_rng_state=True, determinism_check=True,
               allow_cache_mutation=False, **kwargs):
    """Non-reentrant checkpoint of fn(*args, **kwargs) with the policy run by hpac in C++.

    Works on torch 1.13 (no context_fn there): autograd's saved tensors become placeholders
    (torch.autograd.graph.saved_tensors_hooks); the first one unpacked in backward re-runs fn in the recompute
    phase with the forward's RNG state, and ops the policy saved are served from hpac's storage. Under no-grad
    fn runs plainly. Returns fn's result.
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    return checkpoint_with(Invocation(policy, allow_cache_mutation), fn, *args, preserve_rng_state=preserve_rng_state,
                           determinism_check=determinism_check, **kwargs)


def checkpoint_with(invocation, fn, *args, preserve_rng_state=True, determinism_check=True, **kwargs):
    """hpac.checkpoint's machinery around any invocation-like object: one with `.id` and a context manager
    `.region(phase)` for phase 'forward' / 'recompute' (benchmarks plug a Python dispatch mode in here)."""
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    frame = _Frame(fn, args, kwargs, invocation, preserve_rng_state, determinism_check)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack), invocation.region("forward"):
        return fn(*args, **kwargs)


def _checkpointed_forward(forward, policy, *args, **kwargs):
    return checkpoint(forward, *args, policy=policy, **kwargs)


EXPLAIN_MODES = ("off", "full", "selective")


class Explanation:
    """What hpac.explain found: `text` (the per-op table and summary), `data` (the JSON as a dict, schema
    "hpac.explain/1", docs/explain.md), `svg` (the memory timeline)."""

    def __init__(self, handle, rows):
        self._handle = handle
        self.text = handle.text(rows)
        self.json = handle.json()
        self.data = json.loads(self.json)
        self.svg = handle.svg()

    def __str__(self):
        return self.text


def explain(fn, *args, policy="selective", modes=EXPLAIN_MODES, loss=None, json_path=None, svg_path=None,
            rows=0, name=None, **kwargs):
    """Explains one checkpoint region: runs fn(*args, **kwargs) and backward once per mode in `modes` (a subset
    of "off", "full", "selective", in that order of drawing), capturing tensor bytes over each step (the
    tracking allocator), and records what hpac did with each op of the `policy` run (a policy kind, a save
    list or a Budget, as for hpac.checkpoint; a Budget still profiling runs its profile first, so the plan is
    explained): decision, the rule or plan entry behind it, output bytes, measured µs. `loss` maps fn's
    result to the scalar backward starts from (default: the sum of the result). Writes the JSON and the SVG
    when paths are given. Returns an Explanation. The same C++ renders hpac-explain's output."""
    for m in modes:
        if m not in EXPLAIN_MODES:
            raise ValueError(f"hpac.explain: unknown mode {m!r}; allowed: {', '.join(EXPLAIN_MODES)}")
    if policy is None or policy == "off":
        raise ValueError(f"hpac.explain: policy {policy!r} checkpoints nothing, so there is nothing to explain; "
                         "allowed: a policy kind such as 'selective' or 'full', or a save list")
    for path in (json_path, svg_path):
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                raise ValueError(f"hpac.explain: cannot write {path!r}: its folder {folder!r} does not exist or "
                                 "is not writable; give a path in an existing, writable folder")
    if not torch.is_grad_enabled():
        raise RuntimeError("hpac.explain needs grad mode on (it runs backward)")
    label = policy if isinstance(policy, str) else "budget" if isinstance(policy, Budget) else "save_list"
    region = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    track_memory()
    handle = torch.classes.hpac.Explain(f"Python {region}", region, label)
    loss = loss or (lambda out: out.sum())

    def step(policy_for_step, explained, drawn):
        grads = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        inv = None
        if policy_for_step == "off":
            out = fn(*args, **kwargs)
        else:
            inv = Invocation(policy_for_step, explain=explained)
            out = checkpoint_with(inv, fn, *args, **kwargs)
        value = loss(out)
        if drawn:
            handle.mark("backward")
        torch.autograd.backward(value, inputs=grads or None)
        return inv

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if isinstance(fn, torch.nn.Module):
        tensors += list(fn.parameters())

    explained_inv = None
    if isinstance(policy, Budget) and policy.stage == "profiling":
        step(policy, False, False)  # the budget's profile, so that the explained call replays its plan
    for m in list(modes) + ([] if label in modes else [label]):
        drawn = m in modes
        for t in tensors:  # the previous step's gradients are freed before this step's timeline
            t.grad = None
        if drawn:
            handle.capture_begin()
        inv = step(policy if m == label else m, m == label, drawn)
        if drawn:
            handle.capture_end(m)
        if m == label:
            explained_inv = inv
    handle.set_invocation(explained_inv._handle)
    result = Explanation(handle, rows)
    if json_path is not None:
        handle.write(json_path, "json")
    if svg_path is not None:
        handle.write(svg_path, "svg")
    return result


def checkpoint_wrapper(module, mode="full"):
    """Checkpoints every call of module (mode 'full', 'selective' or a Budget from hpac.budget(...), which then
    serves this module's calls) by replacing its forward in place.

    The module object, its children and its state_dict keys stay exactly as they were. Returns module.
    Call unwrap_checkpoint(module) to undo.
    """
    if not isinstance(mode, Budget) and mode not in ("full", "selective"):
        raise ValueError(f"hpac: checkpoint_wrapper mode {mode!r} is not allowed; allowed: 'full', 'selective', "
                         "hpac.budget(...)")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"hpac: checkpoint_wrapper expects a torch.nn.Module, got {type(module).__name__}")
    unwrap_checkpoint(module)
    original = module.forward
    module.forward = functools.partial(_checkpointed_forward, original, mode)  # "full" | "selective" | a Budget
    module._hpac_original_forward = original
    return module


def unwrap_checkpoint(module):
    original = module.__dict__.pop("_hpac_original_forward", None)
    if original is not None:
        module.__dict__.pop("forward", None)
    return module


load()
# The version of the libhpac serving torch.ops.hpac (CMakeLists.txt's project version; the wheel's too).
__version__ = version()
