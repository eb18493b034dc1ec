/*
 * The OS layer: aligned mappings, decommit, the segment map, the clock.
 * Every byte graceslab takes from the OS comes through here, so this is
 * also where fault injection (GRACESLAB_OS_FAIL_AFTER_MB) refuses memory.
 */
#include "alloc/internal.h"

#include <errno.h>
#include <sys/mman.h>
#include <time.h>

/* The segment map's top level (internal.h): zero-initialised, so foreign
   pointers are recognised even before the allocator initialises. */
_Atomic(_Atomic uint8_t *) gsi_segmap_top[(size_t)1 << (GS_ADDR_BITS - GS_MAP_LEAF_SHIFT)];

/* Bytes currently mapped (statistics and fault injection). */
_Atomic size_t gsi_os_mapped_bytes;

static bool injected_failure(size_t size)
{
    long limit_mb = gsi_option(GSI_OPT_OS_FAIL_AFTER_MB);
    if (GS_LIKELY(limit_mb <= 0))
        return false;
    return atomic_load_explicit(&gsi_os_mapped_bytes, memory_order_relaxed) + size >
           (size_t)limit_mb << 20;
}

/* Maps the segment-map leaves of [start, start+len) that do not exist yet.
   Threads mapping in the same region race to publish a leaf: the CAS's
   release (pairing with gsi_map_unit's acquire) publishes the zeroed
   leaf; the loser unmaps its own. Leaves are never unmapped, so a leaf
   pointer, once seen, stays valid. Not counted in gsi_os_mapped_bytes
   (16 KiB per 64 GiB region graceslab maps in). false: no memory for a
   leaf. */
static bool map_reserve(uintptr_t start, size_t len)
{
    const size_t leaf_bytes = GS_MAP_LEAF_UNITS;
    uintptr_t first = start >> GS_MAP_LEAF_SHIFT, last = (start + len - 1) >> GS_MAP_LEAF_SHIFT;
    if (last >> (GS_ADDR_BITS - GS_MAP_LEAF_SHIFT))
        return false; /* above the user address space graceslab maps in */
    for (uintptr_t t = first; t <= last; t++) {
        if (atomic_load_explicit(&gsi_segmap_top[t], memory_order_acquire))
            continue;
        void *leaf = mmap(NULL, leaf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
        if (leaf == MAP_FAILED)
            return false;
        _Atomic uint8_t *none = NULL;
        if (!atomic_compare_exchange_strong_explicit(&gsi_segmap_top[t], &none, leaf,
                                                     memory_order_release, memory_order_acquire))
            munmap(leaf, leaf_bytes);
    }
    return true;
}

void *gsi_os_map_aligned(size_t size, size_t align)
{
    int saved = errno;
    if (injected_failure(size))
        return NULL;
    if (align < GS_PAGE)
        align = GS_PAGE;
    size_t reserve = size + align - GS_PAGE;
    if (reserve < size)
        return NULL;
    /* Not MAP_NORESERVE: with the kernel's default overcommit heuristic
       that flag skips its check, and a request larger than RAM and swap
       together succeeded (glibc's malloc fails it with ENOMEM); the
       program then died touching it. */
    char *raw = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        errno = saved;
        return NULL;
    }
    uintptr_t start = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = start - (uintptr_t)raw;
    size_t tail = reserve - head - size;
    if (head)
        munmap(raw, head);
    if (tail)
        munmap((char *)start + size, tail);
    if (!map_reserve(start, size)) {
        munmap((void *)start, size);
        errno = saved;
        return NULL;
    }
    atomic_fetch_add_explicit(&gsi_os_mapped_bytes, size, memory_order_relaxed);
    return (void *)start;
}

void gsi_os_unmap(void *p, size_t size)
{
    int saved = errno;
    munmap(p, size);
    atomic_fetch_sub_explicit(&gsi_os_mapped_bytes, size, memory_order_relaxed);
    errno = saved;
}

_Atomic size_t gsi_os_decommit_calls;

bool gsi_os_decommit(void *p, size_t size)
{
    int saved = errno;
    atomic_fetch_add_explicit(&gsi_os_decommit_calls, 1, memory_order_relaxed);
    bool ok = madvise(p, size, MADV_DONTNEED) == 0;
    errno = saved;
    return ok;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Set once the kernel said it does not know MADV_POPULATE_WRITE. */
static _Atomic bool populate_unsupported;

/* Pages in a range the caller is about to reuse, in one system call: a
   slab taken back from decommitted slots would otherwise fault its pages
   in one at a time (on this project's VM, 64 MB page by page took 190 to
   210 ms, populated in 64 KiB calls 108 to 126). Best effort: a failure
   (old kernel, no memory now) leaves the pages to fault in as before. */
void gsi_os_populate(void *p, size_t size)
{
    /* Relaxed: a hint; a racing first call only tries once more. */
    if (atomic_load_explicit(&populate_unsupported, memory_order_relaxed))
        return;
    int saved = errno;
    if (madvise(p, size, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
        atomic_store_explicit(&populate_unsupported, true, memory_order_relaxed);
    errno = saved;
}

size_t gsi_os_resident_bytes(void *p, size_t size, bool unknown_resident)
{
    int saved = errno;
    unsigned char vec[64];
    size_t bytes = 0;
    for (size_t off = 0; off < size; off += sizeof vec * GS_PAGE) {
        size_t len = size - off < sizeof vec * GS_PAGE ? size - off : sizeof vec * GS_PAGE;
        if (mincore((char *)p + off, len, vec) != 0) {
            bytes += unknown_resident ? len : 0;
            continue;
        }
        for (size_t i = 0; i < (len + GS_PAGE - 1) / GS_PAGE; i++)
            bytes += vec[i] & 1 ? GS_PAGE : 0;
    }
    errno = saved;
    return bytes;
}

int gsi_os_remap(void *old, size_t old_len, size_t new_len, void *fixed_new)
{
    int saved = errno;
    if (new_len > old_len && injected_failure(new_len - old_len))
        return ENOMEM;
    /* Growing in place may reach a new map region (fixed_new came from
       gsi_os_map_aligned, which reserved its own). */
    if (!fixed_new && new_len > old_len && !map_reserve((uintptr_t)old, new_len)) {
        errno = saved;
        return ENOMEM;
    }
    void *r = fixed_new ? mremap(old, old_len, new_len, MREMAP_MAYMOVE | MREMAP_FIXED, fixed_new)
                        : mremap(old, old_len, new_len, 0);
    int err = r == MAP_FAILED ? errno : 0;
    errno = saved;
    if (err)
        return err;
    if (new_len > old_len)
        atomic_fetch_add_explicit(&gsi_os_mapped_bytes, new_len - old_len, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&gsi_os_mapped_bytes, old_len - new_len, memory_order_relaxed);
    return 0;
}

/* Marks the 4 MiB units covered by [start, start+len). For large mappings
   each unit records its distance to the first (capped at GS_MAP_FAR), so
   gsi_large_of() finds the header in O(1) for any pointer near the start.
   Relaxed stores: a unit is marked before any pointer into it is handed
   out (publication of the pointer orders it) and cleared only after the
   last one is gone. */
/* The byte of unit u, whose leaf exists (map_reserve). */
static _Atomic uint8_t *unit_byte(uintptr_t u)
{
    _Atomic uint8_t *leaf = gsi_map_leaf(u);
    GS_ASSERT(leaf);
    return &leaf[u & (GS_MAP_LEAF_UNITS - 1)];
}

void gsi_map_set(void *start, size_t len, unsigned kind_first)
{
    uintptr_t first = (uintptr_t)start >> GS_SEGMENT_SHIFT;
    uintptr_t last = ((uintptr_t)start + len - 1) >> GS_SEGMENT_SHIFT;
    for (uintptr_t u = first; u <= last; u++) {
        unsigned v = kind_first;
        if (kind_first == GS_MAP_LARGE) {
            uintptr_t d = u - first;
            v = d >= GS_MAP_FAR - GS_MAP_LARGE ? GS_MAP_FAR : GS_MAP_LARGE + (unsigned)d;
        }
        atomic_store_explicit(unit_byte(u), (uint8_t)v, memory_order_relaxed);
    }
}

void gsi_map_clear(void *start, size_t len)
{
    uintptr_t first = (uintptr_t)start >> GS_SEGMENT_SHIFT;
    uintptr_t last = ((uintptr_t)start + len - 1) >> GS_SEGMENT_SHIFT;
    for (uintptr_t u = first; u <= last; u++)
        atomic_store_explicit(unit_byte(u), 0, memory_order_relaxed);
}

uint64_t gsi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t gsi_now_coarse_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return gsi_now_ns(); /* a sandbox that refuses it */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
