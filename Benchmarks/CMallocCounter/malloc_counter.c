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

// Counting must cost far less than the allocation it counts, or it
// inflates every allocating path it measures (a lock-prefixed add per
// counter and a malloc_usable_size per call cost about as much as glibc's
// fast path). So each thread counts in its own slot, written only by that
// thread with relaxed loads and stores (plain moves, no lock prefix), and
// readers add the slots up. Slots are claimed from a fixed table (this code
// cannot allocate); threads past its end share one slot with atomic adds.
// Bytes in use (malloc_usable_size) are tracked only while the memory
// benchmark asks for them.

enum { SLOTS = 512 };

struct slot {
    _Atomic int64_t allocations;
    _Atomic int64_t frees;
    char padding[64 - 2 * sizeof(int64_t)];   // one cache line per thread
};

static struct slot slots[SLOTS + 1];           // the last one is shared
static _Atomic int claimed;
static _Thread_local struct slot *mine;
static _Atomic int64_t live;
static _Atomic int tracking_bytes;
static _Atomic int active;
static int64_t base_allocations, base_frees;   // at the last reset

static inline struct slot *my_slot(void) {
    struct slot *s = mine;
    if (s != NULL) return s;
    int i = atomic_fetch_add_explicit(&claimed, 1, memory_order_relaxed);
    s = &slots[i < SLOTS ? i : SLOTS];
    mine = s;
    return s;
}

static inline void bump(struct slot *s, _Atomic int64_t *counter) {
    if (s == &slots[SLOTS]) {
        atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    } else {
        // This thread is the only writer: a relaxed load and store suffice.
        atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + 1, memory_order_relaxed);
    }
}

static inline void counted(void *p) {
    if (p == NULL) return;
    struct slot *s = my_slot();
    bump(s, &s->allocations);
    if (atomic_load_explicit(&tracking_bytes, memory_order_relaxed))
        atomic_fetch_add_explicit(&live, (int64_t)malloc_usable_size(p), memory_order_relaxed);
    atomic_store_explicit(&active, 1, memory_order_relaxed);
}

static inline void released(void *p) {
    if (p == NULL) return;
    struct slot *s = my_slot();
    bump(s, &s->frees);
    if (atomic_load_explicit(&tracking_bytes, memory_order_relaxed))
        atomic_fetch_sub_explicit(&live, (int64_t)malloc_usable_size(p), memory_order_relaxed);
}

static int64_t total(int frees) {
    int n = atomic_load_explicit(&claimed, memory_order_relaxed);
    if (n > SLOTS) n = SLOTS;
    int64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += atomic_load_explicit(frees ? &slots[i].frees : &slots[i].allocations, memory_order_relaxed);
    sum += atomic_load_explicit(frees ? &slots[SLOTS].frees : &slots[SLOTS].allocations, memory_order_relaxed);
    return sum;
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
    int bytes = atomic_load_explicit(&tracking_bytes, memory_order_relaxed);
    int64_t before = bytes ? (int64_t)malloc_usable_size(pointer) : 0;
    void *p = __libc_realloc(pointer, size);
    struct slot *s = my_slot();
    if (p != NULL) {
        bump(s, &s->allocations);
        if (bytes) atomic_fetch_add_explicit(&live, (int64_t)malloc_usable_size(p) - before, memory_order_relaxed);
    } else if (size == 0) {
        // realloc(p, 0) freed p.
        bump(s, &s->frees);
        if (bytes) atomic_fetch_sub_explicit(&live, before, memory_order_relaxed);
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

int64_t CMallocCounter_allocations(void) { return total(0) - base_allocations; }
int64_t CMallocCounter_frees(void) { return total(1) - base_frees; }
int64_t CMallocCounter_liveBytes(void) { return atomic_load_explicit(&live, memory_order_relaxed); }
int CMallocCounter_isActive(void) { return atomic_load_explicit(&active, memory_order_relaxed); }
void CMallocCounter_trackBytes(int on) { atomic_store_explicit(&tracking_bytes, on != 0, memory_order_relaxed); }

void CMallocCounter_reset(void) {
    base_allocations = total(0);
    base_frees = total(1);
}
