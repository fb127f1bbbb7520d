"""python -m hpac (or the `hpac` command of the pip package): what this installation of hpac offers.

    python -m hpac            version, the library loaded, the torch it was built for, dispatch key, fallback status
    python -m hpac --help     the same, with the Python API and the ways to use hpac
    python -m hpac --version  the version alone
    python -m hpac plan CONFIG --memory-target 70GiB [--world-size 8] [--device h100-sxm] [--out plan.json]
                              a whole step's plan for a machine that is not here (hpac.plan; --help for more)
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
  hpac.checkpoint_wrapper(module, policy="selective")  checkpoint every call of a module, in place
  policy: "selective", "full" (or None), or a save list such as ["aten::mm", "aten::max.dim"]
  hpac.global_stats(), hpac.Invocation(...).stats()    ops seen, saved, served from cache, recomputed
  hpac.track_memory(), hpac.cpu_tensor_memory_stats() CPU tensor bytes (current, peak)
  python -m hpac plan CONFIG --memory-target 70GiB --world-size 8 --device h100-sxm --out plan.json
                                                       plan a step for a machine that is not here (meta device)
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
        f"config library: {_config_library()}",
    ])


def _config_library() -> str:
    """hpac.hf's libhpac_config.so and the yaml-cpp and abseil it was built with (the wheel bundles them), or why
    it is not there."""
    from . import hf
    try:
        path = hf.load_config_library() or hf._config_library_path or "(loaded by torch.ops.load_library)"
    except (RuntimeError, OSError) as e:
        return f"not loaded ({str(e).splitlines()[0]})"
    return f"{path} (built with {torch.ops.hpac_config.built_with()})"


def plan_main(argv) -> int:
    """python -m hpac plan CONFIG ...: a whole step's plan made on the meta device (hpac.plan)."""
    from . import _devices
    from . import plan as _plan
    from ._target import MemoryTargetError
    parser = argparse.ArgumentParser(
        prog="python -m hpac plan",
        description="Plans a training step of the trainer YAML's model for a machine that is not here: the model is "
                    "built on the meta device at the YAML's shapes (nothing of its bytes allocated), hpac runs the "
                    "memory target's steps there, and writes the plan a real run applies with "
                    "activation_checkpoint.plan. Shipped device specs: " + ", ".join(sorted(_devices.SPECS)) + ".")
    parser.add_argument("config", help="the hpac-train YAML (model, train.seq_len, micro_batch, dtype)")
    parser.add_argument("--memory-target", help="the most bytes one rank may hold, a size with a unit: B, KiB, MiB, GiB or TiB, "
                        "e.g. 70GiB (default: "
                        "activation_checkpoint.memory_target, else the device's memory)")
    parser.add_argument("--world-size", type=int, help="FSDP2 shard degree (default: parallel.dp with fsdp, else 1)")
    parser.add_argument("--device", default="h100-sxm", help="a shipped spec or a YAML file (default: h100-sxm)")
    parser.add_argument("--modes", default="", help="fixed modes to measure per rank beside the plan: "
                        "comma-separated off, full, selective")
    parser.add_argument("--out", help="write the plan file (JSON) here")
    parser.add_argument("--report", action="store_true", help="print the whole-step report (else a summary)")
    parser.add_argument("--plot", help="draw the step's picture here (.png or .svg; needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        # the size as written: Note [One size grammar] (policy/byte_size.h), as the YAML's
        result = _plan.plan(args.config, args.memory_target, world_size=args.world_size, device=args.device,
                            modes=modes, out=args.out, log=log)
    except (_plan.PlanError, _devices.DeviceSpecError, MemoryTargetError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = _plan.report_text(result)
    print(text if args.report else "\n".join(text.splitlines()[:3]))
    if args.plot:
        try:
            _plan.plot(result, args.plot)
        except ImportError as e:
            print(f"error: --plot needs matplotlib ({e}); pip install matplotlib", file=sys.stderr)
            return 2
        print(f"picture written to {args.plot}")
    if args.out:
        print(f"plan written to {args.out}; apply it with activation_checkpoint: {{mode: budget, plan: {args.out}}}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        return plan_main(argv[1:])
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
