/*
 * Dedicated caches (kmem_cache-like): objects of one size and alignment in
 * slabs that belong to the cache alone.
 *
 * A cache owns its slabs through a heap of its own (a heap id with no
 * thread), so the slab machinery is shared with malloc: the out-of-band
 * links, the remote chain (a plain free() of a cache object from any thread
 * lands there), and the pending chains of gs_cache_free_rcu(). Cache slabs
 * are never released to other heaps. The cache's lock serialises the owner
 * work (allocation, gs_cache_free, reclaim); gs_cache_free_rcu() takes no
 * lock (it is gs_free_rcu()).
 *
 * GS_CACHE_TYPESAFE_BY_RCU: an empty slab is not given back to its segment
 * at once but after a grace period (retire_cookie), so memory a reader may
 * still reach stays an object of this cache. Objects themselves are reused
 * at once.
 *
 * Locking: c->lock, then (inside slab code) orphan/segment locks. Never
 * waits for a grace period with c->lock held. Fork takes every cache's
 * lock (heap.c).
 */
#include "alloc/internal.h"
#include "rcu/internal.h"

#include <errno.h>
#include <string.h>

struct gs_cache {
    char name[32];
    size_t size;               /* object size asked for */
    size_t align;
    unsigned flags;
    unsigned cls;              /* slab geometry */
    struct gs_cache_lock lock; /* .mutex protects everything below */
    struct gs_heap *heap;      /* owner identity of the cache's slabs */
    struct gs_slab_list slabs; /* every slab, current first */
    struct gs_slab *current;   /* slab allocations come from */
};

static bool slab_ready_locked(struct gs_slab *s)
{
    return s->free_head != GS_LINK_END || gsi_slab_collect(s) ||
           gsi_pending_reclaim_local(s) || gsi_slab_extend(s, 64);
}

/* TYPESAFE_BY_RCU slabs that emptied wait for wait_cookie before retiring;
   others retire at once. Called with c->lock held. */
static void retire_empty_locked(struct gs_cache *c)
{
    for (struct gs_slab *s = c->slabs.first, *next; s; s = next) {
        next = s->next;
        if (s == c->current || s->used || gsi_slab_has_pending(s))
            continue;
        if (c->flags & GS_CACHE_TYPESAFE_BY_RCU) {
            if (!s->wait_cookie) {
                s->wait_cookie = gsi_gp_cookie();
                continue;
            }
            if (!gsi_gp_done(s->wait_cookie))
                continue;
        }
        gsi_heap_list_remove(&c->slabs, s);
        gsi_slab_release(c->heap, s);
        gsi_slab_retire(s);
    }
}

GS_EXPORT struct gs_cache *gs_cache_create(const char *name, size_t size, size_t align,
                                           unsigned flags)
{
    if (align == 0)
        align = 16;
    /* Cache objects stay within the direct classes (32 KiB), as documented:
       an alignment up to 32 KiB keeps them there (gsi_class_aligned rounds
       the size up to a multiple of it). */
    if ((align & (align - 1)) || align > GS_DIRECT_MAX || size == 0 || size > GS_DIRECT_MAX ||
        (flags & ~GS_CACHE_TYPESAFE_BY_RCU)) {
        errno = EINVAL;
        return NULL;
    }
    struct gs_heap *me = gsi_heap_get(); /* initialises the class tables */
    int cls = align <= 16 ? (int)gsi_size_class(size) : gsi_class_aligned(size, align);
    if (!me || cls < 0) {
        errno = cls < 0 ? EINVAL : ENOMEM;
        return NULL;
    }
    struct gs_cache *c = gs_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->heap = gsi_heap_detached();
    if (!c->heap) {
        gs_free(c);
        errno = ENOMEM;
        return NULL;
    }
    if (name)
        strncpy(c->name, name, sizeof c->name - 1);
    c->size = size;
    c->align = align;
    c->flags = flags;
    c->cls = (unsigned)cls;
    pthread_mutex_init(&c->lock.mutex, NULL);
    gsi_cache_lock_register(&c->lock);
    return c;
}

/* Bytes of the cache's objects pending a grace period, and the newest
   cookie they wait for. c->lock held. */
static size_t pending_bytes_locked(struct gs_cache *c, uint64_t *cookie)
{
    size_t n = 0;
    *cookie = 0;
    for (struct gs_slab *s = c->slabs.first; s; s = s->next) {
        if (!gsi_slab_has_pending(s))
            continue;
        for (unsigned k = 0; k < GS_PENDING_CHAINS; k++)
            n += GS_P_COUNT(atomic_load_explicit(&s->pending[k], memory_order_relaxed));
        uint64_t ck = gsi_slab_pending_cookie(s);
        if (ck > *cookie)
            *cookie = ck;
    }
    return n * gsi_classes[c->cls].size;
}

GS_EXPORT void *gs_cache_alloc(struct gs_cache *c)
{
    bool waited = false;
    pthread_mutex_lock(&c->lock.mutex);
retry:;
    struct gs_slab *s = c->current;
    if (!s || !slab_ready_locked(s)) {
        s = NULL;
        for (struct gs_slab *t = c->slabs.first; t; t = t->next)
            if (t != c->current && slab_ready_locked(t)) {
                s = t;
                break;
            }
        if (!s && !waited) {
            /* Before mapping: deferred frees of this cache (the cache path
               is no allocator slow path, so nothing else drives their grace
               periods). Nudge the engine; past the expedite bound, wait
               for their grace period (never with c->lock held; inside a
               read-side critical section the lazy thread drives it), as
               heap refill does. */
            if (atomic_load_explicit(&gsi_pending_unarmed, memory_order_relaxed))
                gsi_pending_kick();
            uint64_t cookie;
            size_t bytes = pending_bytes_locked(c, &cookie);
            if (bytes) {
                waited = true;
                if (bytes >= gsi_pending_expedite_bytes()) {
                    pthread_mutex_unlock(&c->lock.mutex);
                    gsi_gp_wait_or_expedite(cookie);
                    pthread_mutex_lock(&c->lock.mutex);
                } else {
                    gsi_gp_advance();
                }
                goto retry;
            }
        }
        if (!s) {
            retire_empty_locked(c);
            /* (A current slab here is one the cache used up.) */
            bool used_up = c->current != NULL;
            s = gsi_slab_new(c->cls, used_up, 0);
            if (!s && (pthread_mutex_unlock(&c->lock.mutex), gsi_oom_reclaim())) {
                pthread_mutex_lock(&c->lock.mutex);
                s = gsi_slab_new(c->cls, used_up, 0);
            } else if (!s) {
                pthread_mutex_lock(&c->lock.mutex);
            }
            if (!s) {
                pthread_mutex_unlock(&c->lock.mutex);
                errno = ENOMEM;
                return NULL;
            }
            s->cache = c;
            s->typesafe = c->flags & GS_CACHE_TYPESAFE_BY_RCU;
            gsi_slab_adopt(c->heap, s);
            gsi_slab_extend(s, 64);
            gsi_heap_list_push(&c->slabs, s);
        }
        c->current = s;
        s->wait_cookie = 0;
    }
    void *p = gsi_slab_pop(s);
    s->used++;
    GS_VG_ALLOC(p, c->size, 0);
    s->wait_cookie = 0;
    pthread_mutex_unlock(&c->lock.mutex);
    return p;
}

static struct gs_slab *cache_slab_of(struct gs_cache *c, const void *p, uint32_t *idx,
                                     const char *call)
{
    if (gsi_map_kind((uintptr_t)p) != GS_MAP_SMALL)
        gsi_fatal(call, "invalid pointer (not allocated by graceslab)", p);
    struct gs_slab *s = gsi_small_block(p, idx, call);
    if (s->cache != c)
        gsi_fatal(call, "object does not belong to this cache:", p);
    return s;
}

GS_EXPORT void gs_cache_free(struct gs_cache *c, void *p)
{
    if (!p)
        return;
    uint32_t idx;
    struct gs_slab *s = cache_slab_of(c, p, &idx, "gs_cache_free");
    pthread_mutex_lock(&c->lock.mutex);
    uint16_t v = gsi_link_load(s, idx);
    if (v != GS_LINK_ALLOCATED) {
        pthread_mutex_unlock(&c->lock.mutex);
        gsi_bad_free("gs_cache_free", p, v);
    }
    gsi_slab_push(s, idx, p);
    GS_VG_FREE(p);
    if (s->typesafe)
        GS_VG_TYPESAFE(p, c->size);
    if (--s->used == 0 && s != c->current)
        retire_empty_locked(c);
    pthread_mutex_unlock(&c->lock.mutex);
}

GS_EXPORT void gs_cache_free_rcu(struct gs_cache *c, void *p)
{
    if (!p)
        return;
    uint32_t idx;
    cache_slab_of(c, p, &idx, "gs_cache_free_rcu");
    gsi_free_rcu(p, "gs_cache_free_rcu");
}

GS_EXPORT void gs_cache_destroy(struct gs_cache *c)
{
    if (!c)
        return;
    if (gsi_rcu_in_reader())
        gsi_fatal_msg("gs_cache_destroy", "called inside a read-side critical section");
    /* One full grace period after the caller's last free: every pending
       object's cookie is done, and TYPESAFE_BY_RCU readers are gone. */
    gsi_gp_wait(gsi_gp_cookie());
    pthread_mutex_lock(&c->lock.mutex);
    for (struct gs_slab *s = c->slabs.first; s; s = s->next) {
        gsi_slab_collect(s);
        gsi_pending_reclaim_local(s);
    }
    /* A sweep on another thread (gs_reclaim, the engine's lazy thread) may
       have taken a done chain of these slabs before us and be about to
       push it onto the remote chain: those objects would count as live,
       and the push would land on a retired slab. Wait for the sweeps
       running now, then collect what they pushed. */
    gsi_pending_sweeps_quiesce();
    size_t live = 0;
    for (struct gs_slab *s = c->slabs.first; s; s = s->next) {
        gsi_slab_collect(s);
        live += s->used;
    }
    if (live) {
        pthread_mutex_unlock(&c->lock.mutex);
        char what[96] = "destroying cache with live objects: ";
        strncat(what, c->name, sizeof what - strlen(what) - 1);
        gsi_fatal_msg("gs_cache_destroy", what);
    }
    struct gs_slab *s;
    while ((s = c->slabs.first)) {
        gsi_heap_list_remove(&c->slabs, s);
        gsi_slab_release(c->heap, s);
        gsi_slab_retire(s);
    }
    pthread_mutex_unlock(&c->lock.mutex);
    /* Unlisted without its lock held (fork's prepare takes the list's
       lock first): a fork in between finds an empty cache. */
    gsi_cache_lock_unregister(&c->lock);
    pthread_mutex_destroy(&c->lock.mutex);
    gsi_heap_detached_put(c->heap);
    gs_free(c);
}
