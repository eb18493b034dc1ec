/*
 * Large blocks: requests above GS_SMALL_MAX (256 KiB), or with an alignment
 * no size class gives. Each block is its own mapping, starting 4 MiB-aligned
 * (so the segment map can find its header from any pointer into its first
 * units) with the header at the start and the object after it.
 *
 * Freed blocks are kept committed in a small cache (GRACESLAB_LARGE_CACHE_MB,
 * at most CACHE_ENTRIES blocks, each at most CACHE_MAX_AGE_NS old when it is
 * looked at) and reused best-fit: repeated multi-megabyte allocations then
 * cost no page faults. A cached block much longer than the request is not
 * shrunk while the cache budget can also hold its excess ("slack": mapped,
 * resident, past the block's usable end, counted against the same budget,
 * which grows to the live large blocks' bytes when they are more, until the
 * block is freed or reallocated): a program that allocates 5 to
 * 25 MiB blocks one after the other then reuses one 25 MiB mapping with no
 * page faults, as glibc and tcmalloc do, instead of faulting the difference
 * in every time it grows back. realloc of a large block moves pages with
 * mremap instead of copying.
 *
 * Locking: large_lock protects the cache. Live blocks are only touched by
 * the thread freeing or reallocating them.
 */
#include "alloc/internal.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 64
#define CACHE_ENTRIES 16
#define CACHE_MAX_AGE_NS 1000000000ull

static pthread_mutex_t large_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_large *cache_first; /* most recently freed first */
static size_t cache_bytes, cache_count;
/* Slack of all live blocks (see above). Changed by whoever allocates,
   frees or reallocates a block with slack; read racily against the
   budget, which two racing allocations may overshoot by one block's
   slack each (relaxed: a counter, it orders nothing). */
static _Atomic size_t slack_bytes;

/* With large_lock held. The counters are also read without the lock (a
   hint: is the cache worth locking?), hence relaxed atomic stores. */
static void cache_account(ptrdiff_t bytes, int count)
{
    __atomic_store_n(&cache_bytes, cache_bytes + (size_t)bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&cache_count, cache_count + (size_t)count, __ATOMIC_RELAXED);
}

void gsi_large_atfork_prepare(void) { pthread_mutex_lock(&large_lock); }
void gsi_large_atfork_parent(void) { pthread_mutex_unlock(&large_lock); }
void gsi_large_atfork_child(void) { pthread_mutex_unlock(&large_lock); } /* taken in prepare */

size_t gsi_large_cached_bytes(void)
{
    return __atomic_load_n(&cache_bytes, __ATOMIC_RELAXED) +
           atomic_load_explicit(&slack_bytes, memory_order_relaxed);
}

/* Mapped bytes of b past its usable end (whole pages; 0 unless it was
   handed out with slack). */
static size_t block_slack(const struct gs_large *b)
{
    return b->map_len - (size_t)((char *)b->user - (char *)b) - b->usable;
}

static void slack_add(ptrdiff_t bytes)
{
    if (bytes)
        atomic_fetch_add_explicit(&slack_bytes, (size_t)bytes, memory_order_relaxed);
}

/* GRACESLAB_LARGE_CACHE_MB. */
static size_t cache_limit(void)
{
    return (size_t)gsi_option(GSI_OPT_LARGE_CACHE_MB) << 20;
}

/* The budget of the cache and all slack together: GRACESLAB_LARGE_CACHE_MB,
   or the bytes of the live large blocks if more — the large layer never
   keeps more unrequested memory than the program holds in large blocks
   beyond that floor. A fixed budget alone fell off a cliff: a program
   replacing the oldest of 1000 live 33..256 KiB buffers needs about 110 MiB
   of slack for its blocks to stay at the largest size they had; with 64 MiB
   every reuse re-grew a block and faulted its pages in again (10,500
   replacements/s, against 477,000 with jemalloc; 610,000 with 112 MiB).
   (Relaxed reads: counters that order nothing; a race overshoots by one
   block.) */
static size_t cache_budget(void)
{
    size_t limit = cache_limit();
    size_t live = atomic_load_explicit(&gsi_large_live_bytes, memory_order_relaxed);
    return live > limit ? live : limit;
}

/* May a block keep `bytes` of slack? Only while the cache and all slack
   stay within the budget. */
static bool slack_fits(size_t bytes)
{
    return __atomic_load_n(&cache_bytes, __ATOMIC_RELAXED) +
               atomic_load_explicit(&slack_bytes, memory_order_relaxed) + bytes <=
           cache_budget();
}

static struct gs_large *block_resize(struct gs_large *b, size_t len);

static size_t object_offset(size_t align)
{
    return align <= HEADER_BYTES ? HEADER_BYTES : align;
}

static void block_unmap(struct gs_large *b)
{
    size_t len = b->map_len;
    gsi_map_clear(b, len);
    gsi_os_unmap(b, len);
}

/* Takes a cached block for a len-byte mapping: the smallest that fits
   without wasting more than a quarter, else the one closest in size, which
   the caller resizes (its pages are already faulted in, and the cache never
   holds more than its bound). */
static struct gs_large *cache_take(size_t len, size_t region_align)
{
    struct gs_large *best = NULL, **best_link = NULL;
    if (!__atomic_load_n(&cache_count, __ATOMIC_RELAXED))
        return NULL;
    pthread_mutex_lock(&large_lock);
    for (struct gs_large **l = &cache_first, *b; (b = *l); l = &b->next) {
        if ((uintptr_t)b & (region_align - 1))
            continue;
        bool fits = b->map_len >= len && b->map_len - len <= len / 4;
        size_t d = b->map_len > len ? b->map_len - len : len - b->map_len;
        size_t best_d = !best ? SIZE_MAX
                              : best->map_len > len ? best->map_len - len : len - best->map_len;
        bool best_fits = best && best->map_len >= len && best->map_len - len <= len / 4;
        if (!best || (fits && (!best_fits || b->map_len < best->map_len)) ||
            (!fits && !best_fits && d < best_d)) {
            best = b;
            best_link = l;
        }
    }
    if (best) {
        *best_link = best->next;
        cache_account(-(ptrdiff_t)best->map_len, -1);
    }
    pthread_mutex_unlock(&large_lock);
    return best;
}

/* Unmaps cached blocks that are too old, or all of them (force). Returns
   bytes given back. */
static size_t cache_trim(bool force)
{
    struct gs_large *drop = NULL;
    size_t freed = 0;
    uint64_t now = gsi_now_ns();
    pthread_mutex_lock(&large_lock);
    for (struct gs_large **l = &cache_first, *b; (b = *l);) {
        if (force || now - b->cached_at > CACHE_MAX_AGE_NS) {
            *l = b->next;
            cache_account(-(ptrdiff_t)b->map_len, -1);
            b->next = drop;
            drop = b;
        } else {
            l = &b->next;
        }
    }
    pthread_mutex_unlock(&large_lock);
    while (drop) {
        struct gs_large *b = drop;
        drop = b->next;
        freed += b->map_len;
        block_unmap(b);
    }
    return freed;
}

size_t gsi_large_trim(bool force)
{
    return cache_trim(force);
}

void *gsi_large_alloc(size_t size, size_t align, bool zero)
{
    /* Initialisation first, as on the small paths: whatever thread frees
       this block reads what it set (gsi_valgrind), ordered by the hand-off
       of the pointer only if the block was made after it (TSan, on a
       process whose first allocation was a large block). */
    gsi_heap_init_once();
    if (align < 16)
        align = 16;
    if (size == 0)
        size = 1; /* a unique block, inside its own mapping */
    size_t off = object_offset(align);
    /* (off first: with an alignment of 2^63 the difference wrapped.) */
    if (off > PTRDIFF_MAX - GS_PAGE || size > PTRDIFF_MAX - off - GS_PAGE)
        goto fail;
    size_t len = (off + size + GS_PAGE - 1) & ~(size_t)(GS_PAGE - 1);
    size_t region_align = align > GS_SEGMENT_SIZE ? align : GS_SEGMENT_SIZE;
    /* No mapping, cached block or reclaim can make a request fit that
       exceeds the user address space (2^47 bytes unless mmap is given a
       hint above it, which graceslab never does): fail at once, without
       waiting for a grace period or dropping a cached block. */
    if (len >= GS_ADDRESS_SPACE || region_align >= GS_ADDRESS_SPACE - len)
        goto fail;
    gsi_pending_large_refill();
    struct gs_large *b = cache_take(len, region_align);
    bool keep_slack = b && b->map_len > len && b->map_len - len > len / 4 &&
                      slack_fits(b->map_len - len);
    if (b && !keep_slack && (b->map_len < len || b->map_len - len > len / 4)) {
        /* The new offset first: a move keeps the region aligned for it. */
        b->user = (char *)b + off;
        struct gs_large *r = block_resize(b, len);
        if (!r) { /* cannot grow it: give it back to the OS */
            block_unmap(b);
            b = NULL;
        } else {
            b = r;
        }
    }
    bool fresh = !b;
    if (fresh) {
        cache_trim(false);
        b = gsi_os_map_aligned(len, region_align);
        if (!b && gsi_oom_reclaim())
            b = gsi_os_map_aligned(len, region_align);
        if (!b)
            goto fail;
        b->map_len = len;
        gsi_map_set(b, len, GS_MAP_LARGE);
    }
    b->user = (char *)b + off;
    /* A block within a quarter of the request is all usable; one kept
       longer is usable up to the request and the rest is slack. */
    b->usable = (keep_slack ? len : b->map_len) - off;
    slack_add((ptrdiff_t)block_slack(b));
    b->next = NULL;
    b->cookie = 0;
    atomic_store_explicit(&b->state, GS_LARGE_LIVE, memory_order_relaxed);
    b->magic = GS_LARGE_MAGIC;
    atomic_fetch_add_explicit(&gsi_large_live_bytes, b->usable, memory_order_relaxed);
    gsi_fastmap_large(NULL, b->user);
    /* Announced first: to memcheck a cached block is freed memory. */
    GS_VG_ALLOC(b->user, size, fresh);
    if (zero && !fresh)
        memset(b->user, 0, size);
    GS_VG_NOACCESS((char *)b->user + size, b->usable - size);
    return b->user;
fail:
    errno = ENOMEM;
    return NULL;
}

struct gs_large *gsi_large_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned k = gsi_map_kind(a);
    if (k < GS_MAP_LARGE)
        return NULL;
    uintptr_t unit = a >> GS_SEGMENT_SHIFT;
    while (k == GS_MAP_FAR) {
        /* Far inside a huge block: walk back to a unit that knows the
           distance. Only reached by pointers that are not block starts. */
        unit -= GS_MAP_FAR - GS_MAP_LARGE;
        k = gsi_map_unit(unit);
        if (k < GS_MAP_LARGE)
            return NULL;
    }
    unit -= k - GS_MAP_LARGE;
    struct gs_large *b = (struct gs_large *)(unit << GS_SEGMENT_SHIFT);
    if (a < (uintptr_t)b || a >= (uintptr_t)b + b->map_len)
        return NULL;
    return b;
}

void gsi_large_free(struct gs_large *b, const char *call)
{
    if (b->magic != GS_LARGE_MAGIC)
        gsi_fatal(call, "double free of", b->user);
    if (atomic_load_explicit(&b->state, memory_order_relaxed) != GS_LARGE_LIVE)
        gsi_fatal(call, "object already freed with gs_free_rcu(), pending a grace period:", b->user);
    b->magic = 0;
    gsi_fastmap_large(b->user, NULL);
    atomic_fetch_sub_explicit(&gsi_large_live_bytes, b->usable, memory_order_relaxed);
    slack_add(-(ptrdiff_t)block_slack(b)); /* the whole mapping is cached or unmapped */
    /* (The fixed limit: a block the budget holds only because as much is
       live elsewhere is not worth keeping.) */
    if (b->map_len > cache_limit() / 2) {
        block_unmap(b);
        return;
    }
    size_t budget = cache_budget();
    b->cached_at = gsi_now_ns();
    struct gs_large *drop = NULL;
    pthread_mutex_lock(&large_lock);
    b->next = cache_first;
    cache_first = b;
    cache_account((ptrdiff_t)b->map_len, 1);
    /* Over the bounds: drop the oldest (the tail). The budget covers the
       live blocks' slack too (slack_fits): without it, cache and slack
       together reached twice the budget. */
    while (cache_first && (cache_bytes + atomic_load_explicit(&slack_bytes, memory_order_relaxed) >
                               budget ||
                           cache_count > CACHE_ENTRIES)) { /* lock held */
        struct gs_large **l = &cache_first;
        while ((*l)->next)
            l = &(*l)->next;
        struct gs_large *old = *l;
        *l = NULL;
        cache_account(-(ptrdiff_t)old->map_len, -1);
        old->next = drop;
        drop = old;
    }
    pthread_mutex_unlock(&large_lock);
    while (drop) {
        struct gs_large *old = drop;
        drop = old->next;
        block_unmap(old);
    }
}

/* Resizes the mapping of b to len bytes: in place when it shrinks or the
   pages after it are free, else by moving its pages (mremap, no copy) to a
   new 4 MiB-aligned reservation. Returns the block (moved or not), or NULL
   with b untouched. */
static struct gs_large *block_resize(struct gs_large *b, size_t len)
{
    size_t old_len = b->map_len;
    size_t off = (size_t)((char *)b->user - (char *)b);
    int err;
    if (len == old_len) {
        b->usable = len - off; /* any slack becomes usable */
        return b;
    }
    if (len < old_len) {
        /* The map units wholly in the tail are cleared before the tail is
           given back: once it is unmapped, another thread may map a
           segment or block there and set those units for itself. (Cleared
           after, they once erased a new block's entries: its free then
           aborted as an invalid pointer.) The unit holding the new end
           stays the block's. */
        uintptr_t tail = ((uintptr_t)b + len + GS_SEGMENT_MASK) & ~GS_SEGMENT_MASK;
        uintptr_t end = (uintptr_t)b + old_len;
        if (tail < end)
            gsi_map_clear((void *)tail, end - tail);
        if (gsi_os_remap(b, old_len, len, NULL) != 0) {
            /* (Splitting the mapping can fail, at vm.max_map_count.) The
               longer mapping stays; past the new size it is slack. */
            gsi_map_set(b, old_len, GS_MAP_LARGE);
            b->usable = len - off;
            return b;
        }
    } else if ((err = gsi_os_remap(b, old_len, len, NULL)) == 0) {
        gsi_map_set(b, len, GS_MAP_LARGE);
    } else if (err != ENOMEM) {
        /* EFAULT: madvise, mlock or mprotect split the mapping (EAGAIN:
           an mlock limit). A move would fail the same way, and kernels
           before about 6.17 unmap the destination before they find that
           out: another thread could map something there before it is
           unmapped "again" below. Only ENOMEM (the pages after the block
           are taken) is worth a move. The caller copies instead. */
        return NULL;
    } else {
        size_t region_align = off > GS_SEGMENT_SIZE ? off : GS_SEGMENT_SIZE;
        void *dst = gsi_os_map_aligned(len, region_align);
        if (!dst)
            return NULL;
        gsi_map_clear(b, old_len);
        if (gsi_os_remap(b, old_len, len, dst) != 0) {
            /* Left: the kernel itself out of memory. On kernels before
               about 6.17 dst may already be unmapped here (see above). */
            gsi_map_set(b, old_len, GS_MAP_LARGE);
            gsi_os_unmap(dst, len);
            return NULL;
        }
        /* mremap replaced dst's reservation; account for it once. */
        atomic_fetch_sub_explicit(&gsi_os_mapped_bytes, len, memory_order_relaxed);
        b = dst;
        gsi_map_set(b, len, GS_MAP_LARGE);
        b->user = (char *)b + off;
    }
    b->map_len = len;
    b->usable = len - off;
    return b;
}

void *gsi_large_realloc(struct gs_large *b, size_t size)
{
    size_t off = (size_t)((char *)b->user - (char *)b);
    if (size > PTRDIFF_MAX - off - GS_PAGE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t len = (off + size + GS_PAGE - 1) & ~(size_t)(GS_PAGE - 1);
    void *old_user = b->user;
    size_t old_usable = b->usable;
    size_t old_slack = block_slack(b);
    struct gs_large *nb = block_resize(b, len);
    if (!nb) {
        errno = ENOMEM;
        return NULL;
    }
    slack_add((ptrdiff_t)block_slack(nb) - (ptrdiff_t)old_slack);
    /* Live bytes follow the new usable size (free subtracts that one). */
    atomic_fetch_add_explicit(&gsi_large_live_bytes, nb->usable - old_usable,
                              memory_order_relaxed);
    if (nb->user != old_user) /* moved: its fast-map class may differ */
        gsi_fastmap_large(old_user, nb->user);
    return nb->user;
}
