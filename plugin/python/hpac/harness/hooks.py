"""Not API: hooks into hpac's own checkpoint frame for tests and benchmarks.

    checkpoint_with(invocation, fn, *args, **kwargs)   hpac.checkpoint's frame around any invocation-like object:
                                                        one with `.id` and a context manager `.region(phase)` for
                                                        phase 'forward' / 'recompute' (a Python dispatch mode in
                                                        place of hpac's C++ region, an Invocation made by hand)

Its keywords are the frame's: preserve_rng_state, determinism_check, hold_saved, early_stop, and
_inputs_through_hooks (the inputs go through the saved_tensors_hooks around the call; hpac.checkpoint's
respect_saved_tensors_hooks). The library's code is hpac._frame's; it lives outside hpac's namespace because it
takes what no user should have to know.
"""
from hpac._frame import checkpoint_with

__all__ = ["checkpoint_with"]
