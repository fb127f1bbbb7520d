"""What every benchmark shares: where things are, the one environment header every JSON opens with, and writing
the JSON as a run goes (a run stopped early leaves what it measured).

    from bench.common import CONFIG, RESULTS, Run
    run = Run("budget_frontier", out, steps=6)     # the header: torch, hpac, threads, CPUs, load, GLIBC_TUNABLES ...
    run.log("qwen3_moe: off done")                 # "[budget_frontier 12s] qwen3_moe: off done"
    run.data["rows"] = rows; run.save()            # rewrites the JSON, with the load average and wall time so far

The header's fields are spelled one way for every benchmark (Note [One environment header]). The timing loop is
bench.common.timing's, the frontier plot bench.common.plotting's, the report machinery bench.common.report's; what a
few benchmarks share has a module named for it (frontier, oracle_plans, config_run, target_shapes and
target_shapes_table): benchmarks never import each other (bench/README.md). This module imports only the standard
library: bench.report (the docs' figures) runs under any python3.

Note [One environment header]
-----------------------------
Every benchmark JSON starts with the same keys, each spelled one way: "benchmark" (the name), "commit" (git's short
hash, or $HPAC_COMMIT, or null), "torch", "hpac" (libhpac's version, null where hpac is not loaded), "python",
"transformers" (null where not imported), "threads" (torch's intra-op threads in the measuring process), "cpus",
"machine", "glibc_tunables" (the variable, null when unset), "load_average_at_start", and at every save
"load_average_at_end" and "wall_s". A benchmark adds its own keys after them. The reports read the header through
bench.common.report (machine(), tunables()), which also read the older JSONs' spellings ("" or "(unset)" for an
unset GLIBC_TUNABLES).
"""
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
CONFIG = os.path.join(ROOT, "examples", "training_demo", "train.yaml")  # the main job's YAML
# The allocator setting every CPU benchmark runs under (bench/README.md, "Allocator control").
GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def commit():
    """The checkout's short commit ($HPAC_COMMIT first, for a copy without .git), or None."""
    if os.environ.get("HPAC_COMMIT"):
        return os.environ["HPAC_COMMIT"]
    try:
        done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def environment(name):
    """The header of Note [One environment header] for benchmark `name`, measured now."""
    hpac, torch, transformers = (sys.modules.get(m) for m in ("hpac", "torch", "transformers"))
    return {"benchmark": name, "commit": commit(), "torch": torch.__version__ if torch else None,
            "hpac": hpac.version() if hpac else None, "python": platform.python_version(),
            "transformers": transformers.__version__ if transformers else None,
            "threads": torch.get_num_threads() if torch else None, "cpus": os.cpu_count(),
            "machine": platform.machine(), "glibc_tunables": os.environ.get("GLIBC_TUNABLES") or None,
            "load_average_at_start": os.getloadavg()[0]}


class Run:
    """One benchmark run: its JSON (`data`, opened by the header), its log and its save."""

    def __init__(self, name, out, **fields):
        self.name, self.out = name, out
        self.started = time.perf_counter()
        self.data = environment(name)
        self.data.update(fields)

    def log(self, msg):
        print(f"[{self.name} {time.perf_counter() - self.started:.0f}s] {msg}", flush=True)

    def save(self):
        """Writes what was measured so far, with the load average and the wall time now."""
        finish(self.data, self.out, self.started)


def finish(data, out, started):
    """A run's end for a benchmark that builds its dict itself: the load average and wall time (since `started`, a
    time.perf_counter()) added, the JSON written to `out`."""
    data["load_average_at_end"] = os.getloadavg()[0]
    data["wall_s"] = round(time.perf_counter() - started, 1)
    write_json(out, data)


def write_json(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def torch_at_least(major, minor):
    """Whether the imported torch is release major.minor or newer ("2.13.0+cpu", "2.4.0a0+git..." alike)."""
    import torch
    parts = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(parts.group(1)), int(parts.group(2))) >= (major, minor)


def module_command(module, *args, python=None):
    """The argv that runs benchmark module `module` ("bench.budget.memory_target") in a child process; run it with
    cwd=ROOT and env=child_env()."""
    return [python or sys.executable, "-m", module, *map(str, args)]


def child_env(**extra):
    """The environment of a child process: this one's, with hpac's sources and the checkout on PYTHONPATH (so the
    child imports the same hpac and bench as this process) and `extra` set."""
    env = dict(os.environ, **{k: str(v) for k, v in extra.items()})
    paths = [os.path.join(ROOT, "plugin", "python"), ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                              if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
