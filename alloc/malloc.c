/*
 * The override layer: where every malloc-family call enters graceslab.
 *
 * Fast paths (19 instructions for malloc, 25 for free, returns included;
 * the unlikely cases in noinline slow functions):
 *   malloc: size -> the thread's active slab for it (heap->direct, up to
 *           32 KiB; a second size test above 1 KiB; the medium classes
 *           above it in malloc_large, by computed class), pop
 *           the local free list (out-of-band links), mark ALLOCATED; no
 *           count (the active slab is charged in advance, heap.c).
 *   free:   fast-map entry -> slab metadata (a hint: everything after
 *           checks it) -> owner key == thread pointer -> exact index
 *           (inverse and rotate) -> link must be ALLOCATED -> push ->
 *           count down (zero: slab empty, slow).
 * Anything else — first call of a thread, empty slab, large block, another
 * thread's slab, a bad pointer — goes to a slow path.
 *
 * The exported names (malloc, free, ... and glibc's __libc_* aliases) are
 * aliases of the gs_ functions, so LD_PRELOAD and static linking both
 * replace the system allocator without an extra call.
 */
#include "alloc/internal.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define GS_ALIAS(name) __attribute__((alias(#name), visibility("default")))

/* ------------------------------------------------------------ fast paths */

/* Allocates from class cls of h: the aligned slow path's and the medium
   classes' way in. h may be the empty heap (a thread without one, or any
   thread under memcheck): its active slabs are empty, so the slow path
   makes or finds the real one. Every block handed out is announced to
   memcheck, here as in gsi_heap_alloc_slow. zeroed (NULL, or calloc's):
   set to whether the block holds only zero bytes. */
GS_INLINE void *alloc_class(struct gs_heap *h, unsigned cls, size_t size, bool *zeroed)
{
    struct gs_slab *s = h->active[cls];
    if (GS_UNLIKELY(s->free_head == GS_LINK_END))
        return gsi_heap_alloc_slow(h, cls, size, zeroed);
    if (zeroed)
        *zeroed = gsi_slab_next_is_zero(s);
    void *p = gsi_slab_pop_counted(s);
    GS_VG_ALLOC(p, size, 0);
    return p;
}

static GS_NOINLINE void *malloc_small_slow(size_t size)
{
    return gsi_heap_alloc_slow(gsi_tls_heap, gsi_size_class(size), size, NULL);
}

/* Above GS_DIRECT_MAX: the medium classes (up to GS_SMALL_MAX), whose
   class is computed rather than looked up, then large blocks. Safe before
   initialisation for the same reason as the fast path: a thread without
   a heap sees the empty heap, whose active slabs are all empty. */
static GS_NOINLINE void *malloc_large(size_t size)
{
    if (size <= GS_SMALL_MAX)
        return alloc_class(gsi_tls_heap, gsi_class_above_1k(size), size, NULL);
    if (size > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    return gsi_large_alloc(size, 16, false);
}

GS_EXPORT void *gs_malloc(size_t size)
{
    struct gs_slab *s;
    if (GS_LIKELY(size <= 1024))
        s = gsi_tls_heap->direct[(size + 15) >> 4];
    else if (GS_LIKELY(size <= GS_DIRECT_MAX))
        s = gsi_tls_heap->direct[GS_DIRECT_INDEX_ABOVE_1K(size)];
    else
        return malloc_large(size);
    if (GS_LIKELY(s->free_head != GS_LINK_END))
        return gsi_slab_pop(s);
    return malloc_small_slow(size);
}

static GS_NOINLINE void free_slow(void *p, const char *call);

GS_EXPORT void gs_free(void *p)
{
    struct gs_slab *s = gsi_slab_hint(p);
    if (GS_LIKELY(atomic_load_explicit(&s->owner_key, memory_order_relaxed) == gsi_thread_key())) {
        long idx = gsi_slab_index(s, p);
        if (GS_LIKELY(idx >= 0 && gsi_link_allocated_own(s, (uint32_t)idx))) {
            gsi_slab_push(s, (uint32_t)idx, p);
            if (GS_LIKELY(--s->used != 0))
                return;
            gsi_heap_free_emptied(p, s);
            return;
        }
    }
    free_slow(p, "free");
}

/* ------------------------------------------------------------ slow paths */

static struct gs_large *large_block(const void *p, const char *call)
{
    struct gs_large *b = gsi_large_of(p);
    if (GS_UNLIKELY(!b || b->user != p))
        gsi_fatal(call, "invalid pointer (not a block start)", p);
    return b;
}

static GS_NOINLINE void free_slow(void *p, const char *call)
{
    if (!p)
        return;
    int saved = errno;
    unsigned kind = gsi_map_kind((uintptr_t)p);
    if (kind == GS_MAP_SMALL) {
        uint32_t idx;
        struct gs_slab *s = gsi_small_block(p, &idx, call);
        struct gs_heap *h = gsi_tls_mine;
        /* Tell memcheck before the block can be handed out again (another
           thread may reallocate it as soon as it is freed). */
        GS_VG_FREE(p);
        if (atomic_load_explicit(&s->owner_key, memory_order_relaxed) == h->key) {
            gsi_heap_free_local(h, s, idx, call);
        } else {
            /* A heap is needed only to adopt an ownerless slab; if even
               that fails (no memory for a heap) the free goes through the
               remote chain. */
            if (h == &gsi_empty_heap)
                h = gsi_heap_get();
            gsi_slab_free_remote(h, s, idx, call);
        }
    } else if (kind >= GS_MAP_LARGE) {
        struct gs_large *b = large_block(p, call);
        GS_VG_FREE(p); /* before the block can be reused, as above */
        gsi_large_free(b, call);
    } else {
        gsi_fatal(call, "invalid pointer (not allocated by graceslab)", p);
    }
    errno = saved;
}

GS_EXPORT size_t gs_usable_size(const void *p)
{
    if (!p)
        return 0;
    unsigned kind = gsi_map_kind((uintptr_t)p);
    size_t usable;
    if (kind == GS_MAP_SMALL) {
        uint32_t idx;
        usable = gsi_small_block(p, &idx, "malloc_usable_size")->obj_size;
    } else if (kind >= GS_MAP_LARGE) {
        usable = large_block(p, "malloc_usable_size")->usable;
    } else {
        gsi_fatal("malloc_usable_size", "invalid pointer (not allocated by graceslab)", p);
    }
    /* The program may use all of it now; memcheck must know. */
    GS_VG_RESIZE(p, usable);
    return usable;
}

/* A medium block (GS_DIRECT_MAX < size <= GS_SMALL_MAX) cleared unless its
   slab knows it holds only zero bytes (struct gs_slab, zero_from): a block
   never handed out since its slab was made on fresh or given-back slots.
   Not clearing it also leaves its pages untouched, as a fresh mapping
   leaves glibc's and jemalloc's (calloc of 3200 blocks of 64 KiB, three
   rounds: 0.30 s and 204 MB peak RSS when every block was cleared). */
static GS_NOINLINE void *calloc_medium(size_t size)
{
    bool zeroed = false;
    void *p = alloc_class(gsi_tls_heap, gsi_class_above_1k(size), size, &zeroed);
    if (GS_LIKELY(p) && !zeroed) {
        memset(p, 0, size);
        gsi_slab_cleared(gsi_slab_of(p));
    }
    return p;
}

GS_EXPORT void *gs_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (GS_UNLIKELY(__builtin_mul_overflow(n, size, &bytes) || bytes > PTRDIFF_MAX)) {
        errno = ENOMEM;
        return NULL;
    }
    if (bytes > GS_SMALL_MAX)
        return gsi_large_alloc(bytes, 16, true);
    if (bytes > GS_DIRECT_MAX)
        return calloc_medium(bytes);
    void *p = gs_malloc(bytes);
    if (GS_LIKELY(p))
        memset(p, 0, bytes);
    return p;
}

/* The aligned allocations' fast path: the thread's active slab of the
   smallest class whose objects are aligned to align, if it has a free
   object; NULL otherwise (then aligned_slow decides). That class is the
   class of size rounded up to a multiple of align (gsi_class_aligned), so
   malloc's direct[] finds its slab, with no class computed. Safe before
   initialisation: a thread without a heap sees the empty heap, whose
   active slabs are all empty. */
GS_INLINE void *aligned_fast(size_t size, size_t align)
{
    if (align < 16)
        align = 16;
    /* Medium classes (and anything larger) go to the slow path: medium
       objects decay, so their pop may call decay.c, and the slow path pops
       them (gsi_slab_pop_counted). This path then makes no call, and its
       callers save no register. Testing size first keeps `want` from
       overflowing. */
    if (GS_UNLIKELY(size > GS_DIRECT_MAX || align > GS_DIRECT_MAX))
        return NULL;
    size_t want = gsi_aligned_size(size, align);
    if (GS_UNLIKELY(want > GS_DIRECT_MAX))
        return NULL;
    /* GS_DIRECT_INDEX(want) without a branch: with sizes drawn at random
       around 1 KiB the branch was mispredicted half the time. */
    size_t small = (want + 15) >> 4, big = GS_DIRECT_INDEX_ABOVE_1K(want);
    size_t idx = big ^ ((small ^ big) & -(size_t)(want <= 1024));
    struct gs_slab *s = gsi_tls_heap->direct[idx];
    if (GS_UNLIKELY(s->free_head == GS_LINK_END))
        return NULL;
    void *p = gsi_slab_pop(s);
    /* An object's address is never 0: said, so that the callers' test of
       the result folds into the tests above and their slow-path arguments
       need not be kept past the pop (no register saved and restored). */
    if (!p)
        __builtin_unreachable();
    return p;
}

static GS_NOINLINE void *aligned_slow(size_t size, size_t align)
{
    if (size > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    if (align <= 16)
        return gs_malloc(size);
    /* The class table must exist before it is searched (this may be the
       process's first allocation). */
    gsi_heap_init_once();
    int cls = gsi_class_aligned(size, align);
    if (cls >= 0) {
        struct gs_heap *h = gsi_heap_get();
        if (!h) {
            errno = ENOMEM;
            return NULL;
        }
        return alloc_class(h, (unsigned)cls, size, NULL);
    }
    return gsi_large_alloc(size, align, false);
}

void *gsi_malloc_aligned(size_t size, size_t align)
{
    void *p = aligned_fast(size, align);
    if (GS_LIKELY(p))
        return p;
    return aligned_slow(size, align);
}

GS_EXPORT void *gs_aligned_alloc(size_t alignment, size_t size)
{
    if (alignment == 0 || (alignment & (alignment - 1))) {
        errno = EINVAL;
        return NULL;
    }
    return gsi_malloc_aligned(size, alignment);
}

GS_EXPORT void *gs_realloc(void *p, size_t size)
{
    if (!p)
        return gs_malloc(size);
    if (size == 0) {
        free_slow(p, "realloc");
        return NULL;
    }
    size_t usable;
    unsigned kind = gsi_map_kind((uintptr_t)p);
    if (kind == GS_MAP_SMALL) {
        uint32_t idx;
        struct gs_slab *s = gsi_small_block(p, &idx, "realloc");
        uint16_t v = gsi_link_load(s, idx);
        if (v != GS_LINK_ALLOCATED)
            gsi_bad_free("realloc", p, v);
        usable = s->obj_size;
        /* Stay in place when it fits and does not waste more than half. */
        if (size <= usable && (size >= usable / 2 || usable <= 64)) {
            GS_VG_RESIZE(p, size);
            return p;
        }
    } else if (kind >= GS_MAP_LARGE) {
        struct gs_large *b = large_block(p, "realloc");
        if (b->magic != GS_LARGE_MAGIC)
            gsi_fatal("realloc", "realloc of a freed pointer", p);
        if (atomic_load_explicit(&b->state, memory_order_relaxed) != GS_LARGE_LIVE)
            gsi_bad_free("realloc", p, GS_LINK_PENDING);
        usable = b->usable;
        if (size <= usable && size >= usable / 2) {
            GS_VG_RESIZE(p, size);
            return p;
        }
        /* (Under Valgrind a mremap would move the block behind memcheck's
           back: the copy below tells it.) */
        if (!gsi_valgrind && size > GS_SMALL_MAX) {
            int saved = errno;
            void *q = gsi_large_realloc(b, size);
            if (q)
                return q;
            /* mremap fails where a copy works: on a block whose mapping
               madvise, mlock or mprotect split in several. b is intact. */
            errno = saved;
        }
    } else {
        gsi_fatal("realloc", "invalid pointer (not allocated by graceslab)", p);
    }
    /* Growth room: a block that grows a little out of its class is likely
       to grow again, and a slab block cannot grow in place (its
       neighbours are other objects), so the move asks for at least a
       quarter more than the old block, as tcmalloc's realloc does.
       Sixteen strings grown 16 bytes at a time up to 4 KiB, then by a
       quarter up to 256 KiB (bench/realloc), move 48 % fewer times and
       copy 18 % fewer bytes (docs/benchmarks.md). A larger jump (a vector
       that doubles) gets the size asked for, with no room it would not
       use; large blocks grow with mremap instead. If the room is refused,
       the exact size is tried. */
    void *q = NULL;
    size_t room = usable + usable / 4;
    if (kind == GS_MAP_SMALL && size > usable && size < room) {
        int saved = errno;
        if (size <= GS_SMALL_MAX && room > GS_SMALL_MAX)
            room = GS_SMALL_MAX; /* stays a slab block */
        q = gs_malloc(room);
        errno = saved;
        if (q)
            GS_VG_RESIZE(q, size); /* memcheck: the block is what was asked */
    }
    if (!q)
        q = gs_malloc(size);
    if (!q)
        return NULL; /* p stays valid; errno is ENOMEM */
    GS_VG_QUIET_BEGIN();
    memcpy(q, p, size < usable ? size : usable);
    GS_VG_QUIET_END();
    free_slow(p, "realloc");
    return q;
}

/* ----------------------------------------------------- glibc-compatible API */

GS_EXPORT void *malloc(size_t size) GS_ALIAS(gs_malloc);
GS_EXPORT void free(void *p) GS_ALIAS(gs_free);
GS_EXPORT void *calloc(size_t n, size_t size) GS_ALIAS(gs_calloc);
GS_EXPORT void *realloc(void *p, size_t size) GS_ALIAS(gs_realloc);
GS_EXPORT void *aligned_alloc(size_t alignment, size_t size) GS_ALIAS(gs_aligned_alloc);
GS_EXPORT size_t malloc_usable_size(void *p) GS_ALIAS(gs_usable_size);
GS_EXPORT void *__libc_malloc(size_t size) GS_ALIAS(gs_malloc);
GS_EXPORT void __libc_free(void *p) GS_ALIAS(gs_free);
GS_EXPORT void *__libc_calloc(size_t n, size_t size) GS_ALIAS(gs_calloc);
GS_EXPORT void *__libc_realloc(void *p, size_t size) GS_ALIAS(gs_realloc);
GS_EXPORT void cfree(void *p) GS_ALIAS(gs_free);

GS_EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return gs_realloc(p, bytes);
}

/* Out of line, so that posix_memalign's fast path saves no register. */
static GS_NOINLINE int posix_memalign_slow(void **out, size_t alignment, size_t size)
{
    int saved = errno; /* only the slow path can set it */
    void *p = aligned_slow(size, alignment);
    if (!p) {
        errno = saved;
        return ENOMEM;
    }
    *out = p;
    return 0;
}

GS_EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)))
        return EINVAL;
    void *p = aligned_fast(size, alignment);
    if (GS_LIKELY(p)) {
        *out = p;
        return 0;
    }
    return posix_memalign_slow(out, alignment, size);
}

GS_EXPORT void *memalign(size_t alignment, size_t size)
{
    /* glibc: a non-power-of-two alignment is rounded up to one; above
       2^63 there is none (EINVAL). */
    if (alignment > ((size_t)1 << 63)) {
        errno = EINVAL;
        return NULL;
    }
    if (alignment & (alignment - 1))
        alignment = (size_t)1 << (64 - __builtin_clzl(alignment));
    return gsi_malloc_aligned(size, alignment ? alignment : 1);
}
GS_EXPORT void *__libc_memalign(size_t alignment, size_t size) GS_ALIAS(memalign);

GS_EXPORT void *valloc(size_t size)
{
    return gsi_malloc_aligned(size, (size_t)sysconf(_SC_PAGESIZE));
}

GS_EXPORT void *pvalloc(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > PTRDIFF_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    size = size ? (size + page - 1) & ~(page - 1) : page;
    return gsi_malloc_aligned(size, page);
}
GS_EXPORT void *__libc_valloc(size_t size) GS_ALIAS(valloc);
GS_EXPORT void *__libc_pvalloc(size_t size) GS_ALIAS(pvalloc);

/* C23: the size is a hint glibc may check; graceslab knows the size anyway. */
GS_EXPORT void free_sized(void *p, size_t size)
{
    (void)size;
    gs_free(p);
}

GS_EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size)
{
    (void)alignment;
    (void)size;
    gs_free(p);
}
