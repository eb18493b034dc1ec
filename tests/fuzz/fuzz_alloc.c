/*
 * libFuzzer harness: random sequences of graceslab calls checked against a
 * simple model (built and run by tests/fuzz/run).
 *
 * Each input is a program of operations on 64 slots: gs_malloc, gs_calloc,
 * gs_realloc, gs_aligned_alloc, gs_free, gs_free_rcu, a dedicated cache
 * (gs_cache_alloc/free/free_rcu), read-side sections (nested), grace periods
 * (gs_synchronize_rcu, polled cookies) and gs_reclaim. The model knows each
 * live block's requested size, alignment and content seed, and checks:
 *   - gs_usable_size(p) >= the requested size, the alignment asked for;
 *   - every live block keeps its pattern (no overlap, no reuse while live),
 *     gs_calloc blocks are zero, gs_realloc keeps the common prefix;
 *   - a block handed to gs_free_rcu() inside a read-side section keeps its
 *     bytes until that section ends (graceslab never writes it before a
 *     grace period has elapsed);
 *   - a polled cookie reports a grace period after gs_synchronize_rcu();
 *   - outside readers, gs_reclaim(SIZE_MAX) leaves nothing pending, and
 *     never reports more bytes than were deferred.
 * Any violation aborts with a message (a crash for libFuzzer). The harness
 * uses the gs_ API only: linked with libgraceslab.a, the process malloc
 * (libFuzzer's own allocations included) is graceslab's too.
 */
#include "graceslab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSLOTS 64
#define MAX_PROTECTED 512
#define MAX_DEPTH 4

struct block {
    unsigned char *p;
    size_t size;
    size_t align;
    uint32_t seed;
    bool cache; /* from the dedicated cache */
};

static struct block slots[NSLOTS];
/* Blocks deferred inside the current outermost read-side section. */
static struct block protected[MAX_PROTECTED];
static size_t nprotected;
static int depth;
static size_t deferred_bytes; /* usable bytes deferred since pending was last 0 */
static struct gs_cache *cache;
#define CACHE_SIZE 200

/* ------------------------------------------------------------ checks */

static void fail(const char *what, const struct block *b, size_t at)
{
    fprintf(stderr, "fuzz_alloc: %s: block %p size %zu align %zu seed %u, byte %zu\n", what,
            (void *)b->p, b->size, b->align, b->seed, at);
    abort();
}

/* The pattern loops are not coverage-instrumented (libFuzzer would spend
   its time tracing their comparisons) and, beyond 8 KiB, visit the first
   and last 4 KiB and every 61st byte between: any overlap of two blocks
   wider than that still shows. */
#if defined(__clang__)
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif

static inline unsigned char pat(uint32_t seed, size_t i)
{
    return (unsigned char)(seed + i * 0x9Du + (i >> 9));
}

static inline size_t next_pos(size_t i, size_t size)
{
    return size <= 8192 || i < 4096 || i >= size - 4096 ? i + 1 : i + 61;
}

NO_COVERAGE static void fill(struct block *b)
{
    for (size_t i = 0; i < b->size; i = next_pos(i, b->size))
        b->p[i] = pat(b->seed, i);
}

/* The bytes fill() wrote for block b, looked for at q (b->p, or where
   gs_realloc moved it) up to `upto` bytes. */
NO_COVERAGE static void check_at(const struct block *b, const unsigned char *q, size_t upto,
                                 const char *what)
{
    for (size_t i = 0; i < upto; i = next_pos(i, b->size))
        if (q[i] != pat(b->seed, i))
            fail(what, b, i);
}

static void check(const struct block *b, const char *what)
{
    check_at(b, b->p, b->size, what);
}

static void check_new(const struct block *b, const char *call)
{
    if (!b->p) {
        fprintf(stderr, "fuzz_alloc: %s(%zu) returned NULL\n", call, b->size);
        abort();
    }
    if ((uintptr_t)b->p % (b->align < 16 ? 16 : b->align))
        fail("misaligned", b, 0);
    if (gs_usable_size(b->p) < b->size)
        fail("usable size below the requested size", b, gs_usable_size(b->p));
    if (b->cache && gs_usable_size(b->p) < CACHE_SIZE)
        fail("cache object too small", b, 0);
}

/* ------------------------------------------------------------ input */

struct input {
    const uint8_t *d;
    size_t n, i;
};

static unsigned u8(struct input *in)
{
    return in->i < in->n ? in->d[in->i++] : 0;
}

static unsigned u16(struct input *in)
{
    return u8(in) | u8(in) << 8;
}

/* Mostly small sizes, some medium (slab classes above 32 KiB), a few large
   (beyond the slab classes, 256 KiB). */
static size_t size_of(struct input *in)
{
    unsigned k = u8(in);
    unsigned v = u16(in);
    if (k < 160)
        return v % 512;
    if (k < 210)
        return v % 40000;
    if (k < 232)
        return (size_t)v * 4 % 262145;
    if (k < 250)
        return 262145 + (size_t)v * 4 % 300000;
    return (size_t)v * 16; /* up to 1 MiB */
}

/* --------------------------------------------------------------- ops */

static void release(struct block *b, bool rcu)
{
    if (!b->p)
        return;
    check(b, "block changed while live");
    if (rcu) {
        deferred_bytes += gs_usable_size(b->p);
        if (b->cache)
            gs_cache_free_rcu(cache, b->p);
        else
            gs_free_rcu(b->p);
        /* Deferred inside a section: its bytes must stay until the unlock. */
        if (depth > 0 && nprotected < MAX_PROTECTED)
            protected[nprotected++] = *b;
    } else if (b->cache) {
        gs_cache_free(cache, b->p);
    } else {
        gs_free(b->p);
    }
    b->p = NULL;
}

static void check_protected(void)
{
    for (size_t i = 0; i < nprotected; i++)
        check(&protected[i], "deferred block changed before its grace period");
}

static void unlock(void)
{
    check_protected();
    gs_rcu_read_unlock();
    if (--depth == 0)
        nprotected = 0;
}

static void full_reclaim(void)
{
    gs_synchronize_rcu();
    size_t r = gs_reclaim(SIZE_MAX);
    struct gs_stats st;
    gs_stats_get(&st);
    if (st.pending_bytes) {
        fprintf(stderr, "fuzz_alloc: %zu bytes still pending after gs_reclaim(SIZE_MAX)\n",
                st.pending_bytes);
        abort();
    }
    if (r > deferred_bytes) {
        fprintf(stderr, "fuzz_alloc: gs_reclaim returned %zu, only %zu bytes were deferred\n",
                r, deferred_bytes);
        abort();
    }
    deferred_bytes = 0;
}

static void run(struct input *in)
{
    uint32_t seed = 1;
    while (in->i < in->n) {
        unsigned op = u8(in) % 16;
        struct block *b = &slots[u8(in) % NSLOTS];
        seed = seed * 2654435761u + op;
        switch (op) {
        case 0:
        case 1: /* gs_malloc */
            release(b, false);
            *b = (struct block){NULL, size_of(in), 0, seed, false};
            b->p = gs_malloc(b->size);
            check_new(b, "gs_malloc");
            fill(b);
            break;
        case 2: { /* gs_calloc */
            release(b, false);
            size_t n = u8(in) % 64, each = size_of(in) % 4096;
            *b = (struct block){NULL, n * each, 0, seed, false};
            b->p = gs_calloc(n, each);
            check_new(b, "gs_calloc");
            struct block zero = {b->p, b->size, 0, 0, false};
            for (size_t i = 0; i < b->size; i = next_pos(i, b->size))
                if (b->p[i])
                    fail("gs_calloc block not zero", &zero, i);
            fill(b);
            break;
        }
        case 3: { /* gs_realloc: grow, shrink, NULL, 0 */
            if (b->cache)
                release(b, false);
            size_t size = size_of(in);
            if (b->p)
                check(b, "block changed while live");
            if (size == 0 && b->p) {
                if (gs_realloc(b->p, 0) != NULL) {
                    fprintf(stderr, "fuzz_alloc: gs_realloc(p, 0) did not return NULL\n");
                    abort();
                }
                b->p = NULL;
                break;
            }
            unsigned char *q = gs_realloc(b->p, size);
            struct block nb = {q, size, 0, b->seed, false};
            check_new(&nb, "gs_realloc");
            size_t keep = b->p && b->size < size ? b->size : (b->p ? size : 0);
            check_at(b, q, keep, "gs_realloc lost the contents");
            nb.seed = seed;
            *b = nb;
            fill(b);
            break;
        }
        case 4: { /* gs_aligned_alloc */
            release(b, false);
            size_t align = (size_t)1 << (u8(in) % 21); /* 1 .. 1 MiB */
            *b = (struct block){NULL, size_of(in), align, seed, false};
            b->p = gs_aligned_alloc(align, b->size);
            check_new(b, "gs_aligned_alloc");
            fill(b);
            break;
        }
        case 5:
        case 6: /* gs_free */
            release(b, false);
            break;
        case 7:
        case 8: /* gs_free_rcu */
            release(b, true);
            break;
        case 9: /* cache object */
            release(b, u8(in) & 1);
            *b = (struct block){gs_cache_alloc(cache), CACHE_SIZE, 16, seed, true};
            check_new(b, "gs_cache_alloc");
            fill(b);
            break;
        case 10: /* read-side section */
            if (depth < MAX_DEPTH) {
                gs_rcu_read_lock();
                depth++;
            }
            break;
        case 11:
            if (depth > 0)
                unlock();
            break;
        case 12: /* a grace period (not inside a reader: it would abort) */
            if (depth == 0) {
                unsigned long cookie = gs_rcu_get_state();
                gs_synchronize_rcu();
                if (!gs_rcu_poll_state(cookie)) {
                    fprintf(stderr, "fuzz_alloc: cookie %lu not done after a grace period\n",
                            cookie);
                    abort();
                }
            } else {
                (void)gs_rcu_poll_state(gs_rcu_get_state());
            }
            break;
        case 13: /* reclaim: polls inside a reader, exact and complete outside */
            if (depth == 0 && (u8(in) & 1))
                full_reclaim();
            else
                (void)gs_reclaim((size_t)u16(in) << 4);
            check_protected();
            break;
        case 14: /* everything still intact */
            for (int i = 0; i < NSLOTS; i++)
                if (slots[i].p)
                    check(&slots[i], "block changed while live");
            check_protected();
            break;
        case 15: /* usable size stays what it was */
            if (b->p && gs_usable_size(b->p) < b->size)
                fail("usable size shrank", b, 0);
            break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!cache) {
        cache = gs_cache_create("fuzz", CACHE_SIZE, 0, 0);
        if (!cache)
            abort();
    }
    struct input in = {data, size, 0};
    run(&in);
    /* Leave nothing behind: the next input starts from an empty model. */
    while (depth > 0)
        unlock();
    for (int i = 0; i < NSLOTS; i++)
        release(&slots[i], i & 1);
    full_reclaim();
    return 0;
}
