"""The timing loop every step benchmark shares: one forward + backward, timed by a clock of the caller's choice,
with the tensor bytes hpac's tracking CPU allocator saw (peak above the step's start, bytes the forward left for
backward). The collector is run before and kept off during the step, so its pauses fall outside the timing."""
import gc
import time

import hpac


def timed_step(model, loss_fn, inputs, clock=time.perf_counter):
    """(seconds by `clock`, peak bytes above the start, bytes the forward left for backward) of one forward +
    backward; the gradients are left in .grad."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        base = hpac.cpu_tensor_memory_stats()["current_bytes"]
        hpac.reset_cpu_tensor_peak()
        t0 = clock()
        loss = loss_fn(model, inputs)
        kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
        loss.backward()
        seconds = clock() - t0
        peak = hpac.cpu_tensor_memory_stats()["peak_bytes"] - base
    finally:
        gc.enable()
    return seconds, peak, kept


def measure(model, loss_fn, inputs):
    """(seconds, peak bytes above the start, gradients) of one forward + backward."""
    seconds, peak, _ = timed_step(model, loss_fn, inputs)
    return seconds, peak, [p.grad for p in model.parameters()]
