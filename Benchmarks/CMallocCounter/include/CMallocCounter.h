// Counts heap allocations for reconcile-bench. Only the benchmark links this
// target: it defines malloc, calloc, realloc, free and the aligned
// allocators, forwards them to glibc's __libc_* entry points, and keeps
// process-wide counters (relaxed atomics, so the cost is the same for every
// implementation measured).
#ifndef RECONCILE_BENCH_MALLOC_COUNTER_H
#define RECONCILE_BENCH_MALLOC_COUNTER_H

#include <stdint.h>

/// Allocations (malloc, calloc, realloc, aligned) since the start or the last reset.
int64_t CMallocCounter_allocations(void);
/// Frees of non-NULL pointers since the start or the last reset.
int64_t CMallocCounter_frees(void);
/// Bytes currently allocated (usable sizes), process-wide; never reset.
int64_t CMallocCounter_liveBytes(void);
/// Sets the allocation and free counters to zero.
void CMallocCounter_reset(void);
/// Whether the interposed allocator is the one in use (1) or not (0).
int CMallocCounter_isActive(void);

#endif
