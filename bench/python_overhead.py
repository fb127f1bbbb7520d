"""Per-op overhead seen from Python (torch 1.13 here): the same loop of small torch.add calls
  plain               no region
  hpac region         inside an hpac forward region (every op counted, policy asked, recomputed)
  hpac serve          inside an hpac recompute region, every op served from cache
  python mode         inside a do-nothing Python TorchDispatchMode (what a Python SAC mode costs at least)
Rounds are interleaved, the order rotated every round, and the median per-op time of each variant is reported.

    HPAC_LIBRARY=build/plugin/libhpac.so PYTHONPATH=plugin/python /usr/bin/python3 bench/python_overhead.py
"""
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hpac

N = 2000
ROUNDS = 24
a, b = torch.ones(8), torch.ones(8)


class NoOpMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def loop():
    for _ in range(N):
        torch.add(a, b)


def plain():
    t = time.perf_counter()
    loop()
    return time.perf_counter() - t


def hpac_region():
    inv = hpac.Invocation("full")
    t = time.perf_counter()
    with inv.region("forward"):
        loop()
    return time.perf_counter() - t


def hpac_serve():
    inv = hpac.Invocation(["aten::add.Tensor"])
    with inv.region("forward"):
        loop()
    t = time.perf_counter()
    with inv.region("recompute"):
        loop()
    return time.perf_counter() - t


def python_mode():
    t = time.perf_counter()
    with NoOpMode():
        loop()
    return time.perf_counter() - t


variants = {"plain": plain, "hpac region": hpac_region, "hpac serve": hpac_serve, "python mode": python_mode}
times = {k: [] for k in variants}
for fn in variants.values():
    fn()  # warm-up
names = list(variants)
for r in range(ROUNDS):
    # Rotate the order every round: the variant that runs first after another one pays for its leftovers.
    for name in names[r % len(names):] + names[:r % len(names)]:
        times[name].append(variants[name]() / N * 1e9)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {N} adds x {ROUNDS} rounds (median ns/op)")
for name, ns in med.items():
    print(f"  {name:12s} {ns:9.0f} ns/op   +{ns - med['plain']:7.0f} ns over plain")
hpac_over = med["hpac region"] - med["plain"]
mode_over = med["python mode"] - med["plain"]
if hpac_over > 0:
    print(f"python mode overhead / hpac region overhead: {mode_over / hpac_over:.1f}x")
else:
    print("hpac region overhead is below this run's noise; python mode overhead: "
          f"{mode_over:.0f} ns/op")
