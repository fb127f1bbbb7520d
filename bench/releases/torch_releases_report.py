"""docs/compatibility.md (section torch_releases), from bench/results/torch_releases.json
(tools/torch_release_check.sh VERSION)."""
from bench.common.report import load


def torch_releases(r):
    """docs/compatibility.md: current torch releases from pip, one row each (tools/torch_release_check.sh VERSION)."""
    d = load(r, "torch_releases.json")
    out = ["| torch (pip) | build | configure; build (core + Python, jobs) | CTest entries passed | pytest passed / failed "
           "/ skipped | `pip install --no-build-isolation .`, `python -m hpac`, wheel smoke | run |",
           "|---|---|---|---|---|---|---|"]
    for version, e in d["releases"].items():
        kind = f"CUDA {e['cuda']} wheel, on CPU" if e["cuda_build"] else "CPU wheel"
        jobs = f"{e['jobs']} jobs" + (", with the trainer" if e["with_trainer"] else "")
        times = (f"{e['configure_s']} s; {e['build_s']} s ({jobs})" if e["build_s"] is not None
                 else f"not built ({e['failed_step']})")
        c, p, w = e["ctest"], e["pytest"], e["pip_install"]
        ctest = f"{c['passed']} of {c['total']}" if c["total"] else "not run"
        if c["failed"]:
            ctest += " (failed: " + ", ".join(f"`{t}`" for t in c["failed"]) + ")"
        pytest = f"{p['passed']} / {p['failed']} / {p['skipped']}" if p["passed"] is not None else "not run"
        if w["ok"] is None:
            pip = "not run"
        elif not w["ok"]:
            pip = "failed"
        else:
            pip = f"ok ({w['seconds']} s); smoke {'ok' if w['wheel_smoke_ok'] else 'failed'}"
        run = f"{e['date']}, {e['commit']}" + (" (modified tree)" if e["tree_modified"] else "") + \
            f", Python {e['python']}, {e['total_s']} s in all"
        out.append(f"| {e['torch']} | {kind} | {times} | {ctest} | {pytest} | {pip} | {run} |")
    return out
