"""python -m hpac (or the `hpac` command of the pip package): what this installation of hpac offers.

    python -m hpac            version, the library loaded, the torch it was built for, dispatch key, fallback status
    python -m hpac --help     the same, with the Python API and the ways to use hpac
    python -m hpac --version  the version alone
"""
import argparse
import sys

import torch

import hpac

_API = """\
Python API (import hpac):
  hpac.checkpoint(fn, *args, policy="selective")       non-reentrant checkpoint, policy run in C++ (torch >= 1.13)
  torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False,
      context_fn=hpac.context_fn("selective"))         PyTorch's checkpoint with hpac's policy (torch >= 2.1)
  hpac.checkpoint_wrapper(module, mode="selective")    checkpoint every call of a module, in place
  policy: "selective", "full" (or None), or a save list such as ["aten::mm", "aten::max.dim"]
  hpac.global_stats(), hpac.Invocation(...).stats()    ops seen, saved, served from cache, recomputed
  hpac.track_memory(), hpac.memory_stats()             CPU tensor bytes (current, peak)
Without this module: torch.ops.load_library(LIBRARY) or LD_PRELOAD=LIBRARY give torch.ops.hpac.*"""


def status():
    """The lines `python -m hpac` prints: what is loaded and whether the dispatcher fallback is registered."""
    library = hpac.load()
    return "\n".join([
        f"hpac {hpac.__version__}",
        f"library:        {library}",
        f"built for:      torch {torch.ops.hpac.built_for_torch()}",
        f"running:        torch {torch.__version__}",
        f"dispatch key:   {hpac.dispatch_key()}",
        f"fallback:       {hpac.fallback_status()}",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m hpac",
        description="hpac: selective activation checkpointing inside PyTorch's c10 dispatcher.\n\n" + status(),
        epilog=_API, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hpac {hpac.__version__}")
    parser.parse_args(argv)
    print(status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
