// Counts heap allocations for reconcile-bench. Only the benchmark links this
// target: it defines malloc, calloc, realloc, free and the aligned
// allocators, forwards them to glibc's __libc_* entry points, and counts
// per thread (a slot each, no lock-prefixed instruction on the counting
// path), so counting adds little to what it counts and the same for every
// implementation measured.
#ifndef RECONCILE_BENCH_MALLOC_COUNTER_H
#define RECONCILE_BENCH_MALLOC_COUNTER_H

#include <stdint.h>

/// Allocations (malloc, calloc, realloc, aligned) since the start or the last reset.
int64_t CMallocCounter_allocations(void);
/// Frees of non-NULL pointers since the start or the last reset.
int64_t CMallocCounter_frees(void);
/// Bytes allocated minus bytes freed (usable sizes) while tracking was on,
/// process-wide; never reset. Compare two readings taken while on.
int64_t CMallocCounter_liveBytes(void);
/// Turns byte tracking on (1) or off (0); off by default, as it costs a
/// malloc_usable_size per call.
void CMallocCounter_trackBytes(int on);
/// Sets the allocation and free counters to zero (from the calling thread,
/// while no other thread allocates).
void CMallocCounter_reset(void);
/// Whether the interposed allocator is the one in use (1) or not (0).
int CMallocCounter_isActive(void);

#endif
