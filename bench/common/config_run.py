"""One training run of an hpac-train config under one checkpoint mode, measured step by step: the peak of the process's
live CPU tensor bytes (hpac's tracking allocator, absolute: what a memory target counts) and the CPU time of the one
thread over forward, backward and AdamW's step; what bench.budget.memory_target runs per mode and per target and
bench.budget.meta_plan's real runs repeat. The caller tracks memory (hpac.track_memory()) and sets the threads.
"""
import gc
import statistics
import time

import torch

import hpac
import hpac.hf as hf
import hpac.harness.models as hm


def mode_config(base, mode):
    """`base` with activation_checkpoint replaced: a fixed mode, 'budget:<f>', 'target:<bytes>' or 'plan:<file>'."""
    ac = dict(base["activation_checkpoint"])
    name, _, value = mode.partition(":")
    ac.update(mode=name, layers=[], memory_budget=None, memory_target=None)
    if name == "budget":
        ac["memory_budget"] = {"fraction": float(value), "bytes": None, "text": value, "where": "(bench)"}
    if name == "plan":  # a plan file made by `python -m hpac plan` (bench.budget.meta_plan)
        ac.update(mode="budget", plan={"path": value, "where": "(bench)"})
    if name == "target":
        ac.update(mode="budget", memory_target={"bytes": int(value), "text": f"{value}B", "where": "(bench)"})
    return dict(base, activation_checkpoint=ac)


def memtracker_step(model, opt, spec, train, step):
    """One more step under PyTorch's MemTracker (torch.distributed._tools.mem_tracker): its whole-step peak beside
    hpac's tracking allocator's peak of the same step (MemTracker sees the tensors made through its dispatch mode;
    what hpac's fallback keeps below it, it does not)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    ids = hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)
    tracker = MemTracker()
    tracker.track_external(model, opt)
    gc.collect()
    hpac.reset_cpu_tensor_peak()
    with tracker:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    peaks = tracker.get_tracker_snapshot("peak")
    total = sum(v.get("Total", 0) for v in peaks.values())
    return {"memtracker_peak_bytes": total, "hpac_peak_bytes": hpac.cpu_tensor_memory_stats()["peak_bytes"]}


def run(base, mode, warmup, steps, with_memtracker=False):
    """One mode's run: per step (peak bytes, thread seconds, loss, whether a warm-up step), and the MemoryTarget's
    report. The peak is every step's, the first included (a step over a target is an out-of-memory error on a
    device, warm-up or not); the time is the median of the steps after the warm-up."""
    spec, train = base["model"], base["train"]
    gc.collect()
    model = hm.qwen3_moe_model(spec, train["seed"], max_position_embeddings=max(4096, train["seq_len"]))
    model.train()
    prep = hf.prepare(model, mode_config(base, mode), log=lambda level, message: None)
    opt = torch.optim.AdamW(model.parameters(), lr=train["lr"])
    rows = []
    for step in range(warmup + steps):
        ids = hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)
        gc.collect()
        gc.disable()
        hpac.reset_cpu_tensor_peak()
        t0 = time.thread_time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds = time.thread_time() - t0
        gc.enable()
        rows.append({"step": step + 1, "warmup": step < warmup, "peak_bytes": hpac.cpu_tensor_memory_stats()[
            "peak_bytes"], "thread_s": seconds, "loss": loss.item()})
        del loss
    memtracker = memtracker_step(model, opt, spec, train, warmup + steps) if with_memtracker else None
    report = None
    if prep.target is not None:
        report = prep.target.report()
    del model, opt, prep
    gc.collect()
    timed = rows[warmup:] or rows[-1:]
    return {"mode": mode, "steps": rows, "peak_bytes": max(r["peak_bytes"] for r in rows),
            "first_step_peak_bytes": rows[0]["peak_bytes"],
            "median_thread_s": statistics.median(r["thread_s"] for r in timed),
            "losses": [r["loss"] for r in rows], "target": report, "memtracker": memtracker}
