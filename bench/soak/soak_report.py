"""docs/reliability.md "Memory across a run" (section soak), from bench/results/soak.json (bench/soak/soak.py)."""
from bench.common.report import load, machine


def _mib(b, sign=True):
    return "n/a" if b is None else (f"{b / 2**20:+.3f} MiB" if sign else f"{b / 2**20:.1f} MiB")


def soak(r):
    """docs/reliability.md "Memory across a run": the main job over many steps with dropped forwards, exceptions and
    rebuilds (bench/soak/soak.py)."""
    d = load(r, "soak.json")
    first = next(iter(d["runs"].values()))
    every = first["samples"][0]["step"]
    omp = f"; OMP_NUM_THREADS={d['omp_num_threads']}" if "omp_num_threads" in d else ""
    out = [f"Measured by `bench/soak/soak.py` ({machine(d)}{omp}; the longest run {d['wall_s'] / 60:.0f} min"
           f"): the main job (`{d['config']}`), a dropped forward and two exceptions every {first['faults_every']} "
           f"steps, sampled every {every} steps; the fit and the growth between rebuilds leave out the warm-up.", "",
           "| run | mode | steps | rebuilt every | warm-up | dropped forwards | exceptions (forward / recompute) | live "
           "tensor bytes after warm-up (min – max) | RSS growth per 1000 steps (fit) | between rebuilds | across each "
           "rebuild | RSS at the end | Invocations alive (max) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, run in d["runs"].items():
        s = run["summary"]
        done = run["samples"][-1]["step"]
        steps = f"{done}" if done == run["steps"] else f"{done} of {run['steps']} (stopped)"
        warmup = s.get("warmup", done - s["samples_after_warmup"] * every)
        name = key.split(":")[0]
        for other in run.get("other_ranks", []):
            o = other["summary"]
            name += (f" (rank 0; rank {other['rank']}: tensor bytes {o['tensor_bytes_min']} – {o['tensor_bytes_max']}"
                     f", RSS {_mib(o['rss_growth_between_rebuilds_bytes_per_1000_steps'])} per 1000 steps between "
                     "rebuilds)")
        across = ", ".join(_mib(b) for b in s["rss_change_across_rebuilds_bytes"]) or "none"
        out.append(f"| {name} | {run['mode']} | {steps} | {run['rebuild_every']} | {warmup} | "
                   f"{run['dropped_forwards']} | {run['forward_faults']} / {run['recompute_faults']} | "
                   f"{s['tensor_bytes_min']} – {s['tensor_bytes_max']} | {_mib(s['rss_growth_bytes_per_1000_steps'])} | "
                   f"{_mib(s['rss_growth_between_rebuilds_bytes_per_1000_steps'])} | {across} | "
                   f"{_mib(s['rss_last'], sign=False)} | {s['invocations_alive_max']} |")
    return out
