"""Loading libhpac.so and the process-wide ops it registers (torch.ops.hpac.*): version, dispatch key, stats,
the tracking CPU allocator."""
import functools
import os
import threading
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
# Where pip install puts the library (pyproject.toml, tools/cmake/hpacInstall.cmake).
_PACKAGED = os.path.join(_HERE, "lib", "libhpac.so")
_load_lock = threading.Lock()
_MARKER = b"hpac-built-for-torch="


def _ops_present(namespace: str = "hpac", op: str = "version") -> bool:
    """Whether torch.ops.<namespace>.<op> is registered (its library loaded)."""
    try:
        getattr(getattr(torch.ops, namespace), op)
        return True
    except (AttributeError, RuntimeError):
        return False


def _major_minor(version: str) -> Tuple[int, int]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def built_for_torch(path: str) -> Optional[str]:
    """The torch version the libhpac.so at `path` was compiled against, read from the file without loading it.

    Args:
        path: a libhpac.so.

    Returns:
        The version string, or None if the file carries no marker (a build older than the marker).
    """
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(_MARKER)
    if at < 0:
        return None
    end = data.find(b";", at)
    return data[at + len(_MARKER):end].decode("ascii", "replace")


def _check_same_torch(path: str) -> None:
    # Note [One torch per libhpac] (plugin/registration.cpp): a libhpac built for another torch must not be
    # dlopen'ed at all, since the loader may pull a second libtorch into the process, which crashes.
    built = built_for_torch(path)
    if built is not None and _major_minor(built) != _major_minor(torch.__version__):
        raise RuntimeError(
            f"hpac: '{path}' was built for torch {built} but this Python runs torch {torch.__version__}; it was not "
            "loaded. Build hpac against this torch (HPAC_TORCH_PYTHON=<this python> tools/build.sh; tools/build.sh "
            "--torch debian for Debian's) or point HPAC_LIBRARY at a libhpac.so built for it")


def _default_library() -> str:
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


def load(path: Optional[str] = None) -> str:
    """Makes torch.ops.hpac / torch.classes.hpac available.

    Nothing is loaded when they are already there (LD_PRELOAD, or an earlier load). A library built for another
    torch release is refused with a RuntimeError naming both versions, before it is loaded (also when `path` is
    given while hpac is loaded).

    Args:
        path: the library to load; default $HPAC_LIBRARY, else the package's (hpac/lib/libhpac.so, after pip
            install), else the repository's build for this torch (build/plugin/libhpac.so or
            build-torch<version>/plugin/libhpac.so).

    Returns:
        The path of the library serving torch.ops.hpac.
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


def version() -> str:
    """The version of the libhpac serving torch.ops.hpac (CMakeLists.txt's project version; the wheel's too)."""
    return torch.ops.hpac.version()


def dispatch_key() -> str:
    """The dispatch key hpac's fallback is registered on (Fake unless HPAC_DISPATCH_KEY says otherwise)."""
    return torch.ops.hpac.dispatch_key()


def fallback_status() -> str:
    """Whether hpac's fallback is registered, and if not, why."""
    return torch.ops.hpac.fallback_status()


def global_stats() -> Dict[str, int]:
    """Ops seen, saved, served from cache, recomputed, skipped, ignored: summed over every invocation so far."""
    return dict(torch.ops.hpac.global_stats())


def reset_global_stats() -> None:
    torch.ops.hpac.reset_global_stats()


def track_memory() -> None:
    """Counts CPU tensor bytes from now on: hpac's tracking allocator wraps the CPU allocator for the rest of the
    process (every CPU allocation then takes its mutex and a map insert; Note [The tracker is installed while asked
    for], replay/tracking_allocator.h). Nothing else in hpac installs it for good."""
    torch.ops.hpac.track_memory()


def memory_tracked() -> bool:
    """Whether hpac's tracking allocator is the CPU allocator now (after track_memory(), or while explain draws)."""
    return bool(torch.ops.hpac.memory_tracked())


def cpu_tensor_memory_stats() -> Dict[str, int]:
    """{'current_bytes', 'peak_bytes', 'allocations'} of the CPU tensors allocated while the tracking allocator was
    installed (track_memory()); zeros if it never was. CPU tensor bytes only: CUDA memory is
    torch.cuda.memory_stats(). Reading installs nothing."""
    return dict(torch.ops.hpac.memory_stats())


def reset_cpu_tensor_peak() -> None:
    """Sets cpu_tensor_memory_stats()'s 'peak_bytes' to its 'current_bytes' (CPU tensor bytes only)."""
    torch.ops.hpac.reset_peak_memory()


def _deprecated_name(old: str, new: Callable) -> Callable:
    """`new` under its old name, warning with a DeprecationWarning at each call; kept for one release."""
    @functools.wraps(new)
    def alias(*args, **kwargs):
        warnings.warn(f"hpac.{old} is deprecated: it counts CPU tensor bytes only, and is now named "
                      f"hpac.{new.__name__}; the old name goes in the next release", DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated name of {new.__name__} (DeprecationWarning); kept for one release."
    return alias


memory_stats = _deprecated_name("memory_stats", cpu_tensor_memory_stats)
reset_peak_memory = _deprecated_name("reset_peak_memory", reset_cpu_tensor_peak)
