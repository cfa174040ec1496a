// See include/CMallocCounter.h. glibc exports its allocator as __libc_malloc
// and friends, so these definitions can forward without dlsym (which itself
// allocates).
#include "CMallocCounter.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void __libc_free(void *pointer);
extern void *__libc_memalign(size_t alignment, size_t size);

static _Atomic int64_t allocations;
static _Atomic int64_t frees;
static _Atomic int64_t live;
static _Atomic int active;

static inline void counted(void *p) {
    if (p == NULL) return;
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&live, (int64_t)malloc_usable_size(p), memory_order_relaxed);
    atomic_store_explicit(&active, 1, memory_order_relaxed);
}

static inline void released(void *p) {
    if (p == NULL) return;
    atomic_fetch_add_explicit(&frees, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&live, (int64_t)malloc_usable_size(p), memory_order_relaxed);
}

void *malloc(size_t size) {
    void *p = __libc_malloc(size);
    counted(p);
    return p;
}

void *calloc(size_t count, size_t size) {
    void *p = __libc_calloc(count, size);
    counted(p);
    return p;
}

void *realloc(void *pointer, size_t size) {
    if (pointer == NULL) return malloc(size);
    int64_t before = (int64_t)malloc_usable_size(pointer);
    void *p = __libc_realloc(pointer, size);
    if (p != NULL) {
        atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&live, (int64_t)malloc_usable_size(p) - before, memory_order_relaxed);
    } else if (size == 0) {
        // realloc(p, 0) freed p.
        atomic_fetch_add_explicit(&frees, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&live, before, memory_order_relaxed);
    }
    return p;
}

void free(void *pointer) {
    released(pointer);
    __libc_free(pointer);
}

void *memalign(size_t alignment, size_t size) {
    void *p = __libc_memalign(alignment, size);
    counted(p);
    return p;
}

void *aligned_alloc(size_t alignment, size_t size) {
    return memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
    void *p = memalign(alignment, size);
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

int64_t CMallocCounter_allocations(void) { return atomic_load_explicit(&allocations, memory_order_relaxed); }
int64_t CMallocCounter_frees(void) { return atomic_load_explicit(&frees, memory_order_relaxed); }
int64_t CMallocCounter_liveBytes(void) { return atomic_load_explicit(&live, memory_order_relaxed); }
int CMallocCounter_isActive(void) { return atomic_load_explicit(&active, memory_order_relaxed); }

void CMallocCounter_reset(void) {
    atomic_store_explicit(&allocations, 0, memory_order_relaxed);
    atomic_store_explicit(&frees, 0, memory_order_relaxed);
}
