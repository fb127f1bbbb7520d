/* hpac/plugin/c_api.h
 *
 * A C ABI for programs that load libhpac.so at run time (dlopen + dlsym) and
 * do not link it: benchmarks measuring "before/after hpac is loaded" in one
 * process, other languages. Every function returns 0 on success; on failure a
 * non-zero code and the message is available from hpac_last_error() (this
 * thread, until the next call).
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hpac_invocation hpac_invocation;

/* kind: "selective", "full", or "save_all" (every op saved; for benchmarks). */
int hpac_invocation_create(const char* kind, hpac_invocation** out);
/* phase: 0 = forward, 1 = recompute. One region at a time per invocation, entered and exited on one thread. */
int hpac_region_enter(hpac_invocation* inv, int phase);
int hpac_region_exit(hpac_invocation* inv);
void hpac_invocation_destroy(hpac_invocation* inv);
const char* hpac_last_error(void);

/* For hpac's Python package, which calls these through ctypes once per op while a Python policy_fn decides
 * (Note [Decided after the op], policy/checkpoint_policy.h) or an outer dispatch mode watches a recompute (Note
 * [Outer dispatch modes see what ran], plugin/python/hpac/_policy_fn.py). `invocation` is the address
 * torch.classes.hpac.Invocation's address() returns; `op` comes from hpac_operator. */
/* The registered operator `name` ("aten::mm") with `overload` ("" or "default": the unnamed one): a handle, or NULL
 * when no such operator is registered. The address stays valid for the process; what it names is refreshed by the
 * first hpac_operator call after hpac_operator_generation() moved (an operator registered or deregistered), so a
 * caller that caches handles clears its cache when the generation moves and asks again. */
const void* hpac_operator(const char* name, const char* overload);
/* Bumped whenever an operator is registered or deregistered (a dispatcher registration listener). */
unsigned long long hpac_operator_generation(void);
/* The answer (0..3: MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE, PREFER_RECOMPUTE) for the op the forward kept last.
 * 1: settled; 0: the last kept op is not `op` (ignored, a view, or settled already); -1: error. */
int hpac_invocation_settle_last(void* invocation, const void* op, int policy);
/* 1: the next call of `op` in this recompute runs its kernel; 0: it is served from storage or skipped. */
int hpac_invocation_runs_in_recompute(const void* invocation, const void* op);
/* Sets whether hpac's key is excluded on this thread (ops then bypass every region) and returns the previous setting:
 * set 1 around code that is not the region's (a Python policy_fn), then restore the returned value. */
int hpac_exclude_key(int excluded);

#ifdef __cplusplus
}
#endif
