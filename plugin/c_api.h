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

#ifdef __cplusplus
}
#endif
