"""The counters the harness reports from hpac's per-layer stats (hpac.hf's Preparation.take_layer_stats: one dict
per layer, hpac.Invocation.stats() summed over the layer's calls), summed over the layers, and the one memory meter
of a run's device. Step-time medians are statistics.median's, everywhere."""
import time

import torch

import hpac

# What a region did with the ops it saw (hpac.Invocation.stats(); docs/python.md): saved in the forward, served from
# hpac's storage in the recompute instead of running, recomputed, skipped (a recompute's op nothing needs), ignored
# (profiler and FSDP lifecycle ops).
FIELDS = ("saved", "served", "recomputed", "skipped", "ignored")


def totals(layer_stats, fields=FIELDS):
    """{field: the field summed over the layers' stats dicts (0 where a layer has none)}."""
    return {k: sum(s.get(k, 0) for s in layer_stats) for k in fields}


class Memory:
    """Allocated tensor bytes on a run's device: hpac's tracking CPU allocator (switched on here) on CPU, the CUDA
    caching allocator's counters on CUDA; times taken after a device synchronisation."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        if not self.cuda:
            hpac.track_memory()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def current(self):
        return torch.cuda.memory_allocated() if self.cuda else hpac.cpu_tensor_memory_stats()["current_bytes"]

    def peak(self):
        return torch.cuda.max_memory_allocated() if self.cuda else hpac.cpu_tensor_memory_stats()["peak_bytes"]

    def reset_peak(self):
        """Resets the peak (after the device's pending work); returns the bytes live now."""
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            hpac.reset_cpu_tensor_peak()
        return self.current()

    def elapsed(self, t0):
        """Seconds since perf_counter() read t0, the device's work included."""
        self.sync()
        return time.perf_counter() - t0
