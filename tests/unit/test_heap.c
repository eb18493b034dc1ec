/*
 * Thread heaps (alloc/heap.c): one heap per thread, pooled at thread exit,
 * abandoned slabs orphaned and adopted, empty slabs retired, fork.
 * Linked with the static archive.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"
#include "graceslab.h"
#include "rcu/internal.h"
#include "../common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <limits.h>
#include <malloc.h>
#include <sys/mman.h>

static void run_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

static void count_heap(struct gs_heap *h, void *arg)
{
    size_t *n = arg;
    n[0]++;
    if (h->live)
        n[1]++;
}

/* n[0]: heaps ever made, n[1]: live heaps. */
static void count_heaps(size_t n[2])
{
    n[0] = n[1] = 0;
    gsi_heaps_foreach(count_heap, n);
}

static void *record_heap(void *arg)
{
    void *p = malloc(32);
    *(struct gs_heap **)arg = gsi_tls_heap;
    free(p);
    return NULL;
}

Test(heap, one_heap_per_thread)
{
    free(malloc(32));
    struct gs_heap *mine = gsi_tls_heap;
    cr_assert_neq(mine, &gsi_empty_heap, "malloc did not give the thread a heap");
    cr_assert(mine->live);
    struct gs_heap *other = NULL;
    pthread_t t;
    /* While the other thread is alive its heap must differ from mine. */
    cr_assert_eq(pthread_create(&t, NULL, record_heap, &other), 0);
    pthread_join(t, NULL);
    cr_assert_not_null(other);
    cr_assert_neq(other, mine);
    cr_assert_neq(other->id, mine->id);
    cr_assert_not(other->live, "heap of an exited thread still live");
}

/* Heaps of exited threads are pooled and reused: a thousand short threads
   in sequence make at most a couple of heaps. */
Test(heap, heaps_pooled_at_thread_exit)
{
    free(malloc(16));
    size_t n0[2], n1[2];
    count_heaps(n0);
    for (int i = 0; i < 1000; i++) {
        struct gs_heap *h;
        run_thread(record_heap, &h);
    }
    count_heaps(n1);
    cr_assert_leq(n1[0], n0[0] + 1, "%zu heaps made by 1000 sequential threads", n1[0] - n0[0]);
    cr_assert_eq(n1[1], n0[1], "live heaps %zu, were %zu", n1[1], n0[1]);
}

struct leaver {
    void *ptrs[3000];
    int n;
};

static void *leave_objects(void *arg)
{
    struct leaver *l = arg;
    /* Allocate some, free every other one, exit with the rest live. */
    for (int i = 0; i < 3000; i++)
        l->ptrs[i] = malloc(96);
    for (int i = 0; i < 3000; i += 2)
        free(l->ptrs[i]);
    l->n = 3000;
    return NULL;
}

static void count_slab_class(struct gs_slab *s, void *arg)
{
    size_t *n = arg;
    if (s->cls == gsi_size_class(96))
        n[0]++;
    if (GS_X_OWNER(atomic_load(&s->xstate)) == 0)
        n[1]++;
}

/* A thread exits with live objects in slabs that also hold free objects:
   those slabs become ownerless orphans; frees from this thread adopt them,
   and once everything is freed the slabs are retired. */
Test(heap, exited_thread_slabs_orphaned_adopted_retired)
{
    /* Retirement at once is what this checks: heaps keep no empty slab
       (each Criterion test runs in its own process). */
    gsi_option_set(GSI_OPT_HEAP_EMPTY_KB, 0);
    static struct leaver l;
    size_t before[2] = {0, 0}, after[2] = {0, 0};
    gsi_segments_foreach(count_slab_class, before);
    run_thread(leave_objects, &l);
    for (int i = 1; i < l.n; i += 2) {
        struct gs_slab *s = gsi_slab_of(l.ptrs[i]);
        cr_assert_eq(s->kind, GS_SLAB_SMALL);
        uint32_t owner = GS_X_OWNER(atomic_load(&s->xstate));
        cr_assert(owner == 0 || owner == gsi_tls_heap->id,
                  "slab of an exited thread owned by heap %u", owner);
    }
    for (int i = 1; i < l.n; i += 2) {
        struct gs_slab *s = gsi_slab_of(l.ptrs[i]);
        free(l.ptrs[i]);
        if (s->kind == GS_SLAB_SMALL)
            cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), gsi_tls_heap->id,
                         "free into an orphan did not adopt it");
    }
    gsi_segments_foreach(count_slab_class, after);
    cr_assert_leq(after[0], before[0] + 1, "class slabs: %zu before, %zu after", before[0],
                  after[0]);
}

/* Orphans with free objects are adopted by refills in other heaps rather
   than mapping new slabs. */
static void *allocate_after(void *arg)
{
    void **out = arg;
    for (int i = 0; i < 1000; i++)
        out[i] = malloc(96);
    return NULL;
}

Test(heap, refill_adopts_orphans)
{
    static struct leaver l;
    static void *more[1000];
    run_thread(leave_objects, &l);
    struct gs_stats st0, st1;
    gs_stats_get(&st0);
    run_thread(allocate_after, more);
    gs_stats_get(&st1);
    /* 1000 objects fit in the 1500 freed slots of the orphaned slabs. */
    cr_assert_leq(st1.slabs, st0.slabs, "refill mapped %zu new slabs instead of adopting",
                  st1.slabs - st0.slabs);
    for (int i = 0; i < 1000; i++)
        free(more[i]);
    for (int i = 1; i < l.n; i += 2)
        free(l.ptrs[i]);
}

/* An empty slab that is not the active one is kept for reuse only within
   the heap's bound (2 MiB, counted in empty_bytes; the shared budget is
   off here, see shared_keep_bounded_for_all_heaps) and retired beyond it;
   the active one is kept (no map/unmap per malloc/free pair). */
Test(heap, empty_slabs_retired_active_kept)
{
    gsi_option_set(GSI_OPT_HEAP_SHARED_KEEP_MB, 0);
    enum { N = 5000 };
    static void *p[N];
    unsigned cls = gsi_size_class(700);
    for (int i = 0; i < N; i++)
        p[i] = malloc(700);
    struct gs_slab *active = gsi_tls_heap->active[cls];
    cr_assert_eq(gsi_slab_of(p[N - 1]), active);
    for (int i = 0; i < N; i++)
        free(p[i]);
    cr_assert_eq(gsi_tls_heap->active[cls], active, "active slab dropped when empty");
    /* The active slab carries an advance charge (see refill), and its
       lists say it is empty. */
    cr_assert_gt(active->used, 0);
    cr_assert_eq(gsi_slab_recount(active), 0);
    /* Other code (Criterion) may own live objects of this class: empty
       slabs may stay only as kept ones, within the bound. 5000 objects of
       700 B span 54 slabs, more than the bound, so some were retired. */
    size_t kept = 0, n = 0;
    for (struct gs_slab *s = gsi_tls_heap->partial[cls].first; s; s = s->next, n++)
        cr_assert_neq(s->used, 0, "empty slab on the partial list, not kept");
    for (struct gs_slab *s = gsi_tls_heap->kept[cls].first; s; s = s->next, n++) {
        cr_assert(s->kept_empty && s->used == 0, "slab on the kept list not kept empty");
        kept += (size_t)s->span * GS_SLOT_SIZE;
    }
    cr_assert_leq(kept, gsi_tls_heap->empty_bytes);
    cr_assert_leq(gsi_tls_heap->empty_bytes, (size_t)2 << 20);
    cr_assert_lt(n, 54, "every emptied slab was kept");
    void *q = malloc(700);
    cr_assert_eq(gsi_slab_of(q), active);
    free(q);
}

/* heap.c, gsi_heap_retire_idle_kept: empty slabs a heap keeps and no
   refill takes go back to their segments at the second decay pass after
   they were kept, not at the first; the active slab stays. The period is
   long while the test allocates and frees (a stall there would run a pass
   amid the frees), 1 ms for the passes it makes. */
static void decay_pass_now(struct gs_heap *h, unsigned cls)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 1);
    gst_sleep_ms(5);
    gsi_heap_decay(h, cls);
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
}

Test(heap, idle_kept_slabs_go_back)
{
    gsi_option_set(GSI_OPT_HEAP_SHARED_KEEP_MB, 0);
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    enum { N = 3000 }; /* about 32 slabs of 700 B: more than the 2 MiB kept */
    static void *p[N];
    unsigned cls = gsi_size_class(700);
    for (int i = 0; i < N; i++)
        cr_assert_not_null(p[i] = malloc(700));
    struct gs_heap *h = gsi_tls_mine;
    struct gs_slab *active = h->active[cls];
    for (int i = 0; i < N; i++)
        free(p[i]);
    size_t kept = h->kept[cls].count;
    cr_assert_gt(kept, 1, "nothing kept to begin with");
    decay_pass_now(h, cls);
    cr_assert_eq(h->kept[cls].count, kept, "kept slabs retired at the first pass");
    decay_pass_now(h, cls);
    cr_assert_eq(h->kept[cls].count, 0, "%zu kept slabs stayed after two passes",
                 h->kept[cls].count);
    cr_assert_eq(h->empty_bytes, 0);
    cr_assert_eq(h->active[cls], active, "the active slab went too");
    /* Slabs kept again later start anew. */
    for (int i = 0; i < N; i++)
        cr_assert_not_null(p[i] = malloc(700));
    for (int i = 0; i < N; i++)
        free(p[i]);
    cr_assert_gt(h->kept[cls].count, 1);
    decay_pass_now(h, cls);
    cr_assert_gt(h->kept[cls].count, 1, "slabs kept since the last pass retired at the next");
}

/* A heap keeps at most two emptied medium slabs of each span, of all
   classes together, the newest: the others go back to their segments
   (heap.c, "Medium reuse"). In a thread of its own, whose heap has no
   slab of these classes from before. Fails with one kept per class (the
   rule until the thirty-sixth session: one of each of the six classes
   below, two spans). */
struct medium_keep {
    size_t retired;    /* bytes the 40,000 B frees retired to the segments */
    unsigned most;     /* most medium slabs of one span kept at once */
    bool newest;       /* the kept ones were the last two emptied */
};

static unsigned kept_medium_slabs(const struct gs_heap *h, unsigned span)
{
    unsigned n = 0;
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++)
        if (gsi_classes[c].span == span)
            n += (unsigned)h->kept[c].count;
    return n;
}

static void *medium_keep_run(void *arg)
{
    struct medium_keep *m = arg;
    enum { N = 64 };
    static void *medium[N];
    free(malloc(1)); /* the thread's heap */
    struct gs_heap *h = gsi_tls_mine;
    static const size_t sizes[] = {40000, 60000, 90000, 130000, 200000, 250000};
    struct gs_slab *last[2] = {NULL, NULL}; /* the two slabs emptied last */
    m->newest = true;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int i = 0; i < N; i++)
            medium[i] = malloc(sizes[k]);
        size_t dirty = gsi_segments_dirty_bytes();
        for (int i = 0; i < N; i++) {
            struct gs_slab *s = gsi_slab_of(medium[i]);
            free(medium[i]);
            if (s->where == GS_IN_KEPT && s != last[1]) {
                last[0] = last[1];
                last[1] = s;
            }
            unsigned n = kept_medium_slabs(h, s->span);
            m->most = n > m->most ? n : m->most;
        }
        if (k == 0)
            m->retired = gsi_segments_dirty_bytes() - dirty;
        /* (Nothing kept at all fails here too, not by a crash.) */
        m->newest &= last[1] && last[1]->where == GS_IN_KEPT &&
                     (!last[0] || last[0]->where == GS_IN_KEPT);
    }
    return NULL;
}

Test(heap, emptied_medium_slabs_kept_two_newest)
{
    gsi_option_set(GSI_OPT_PURGE_DELAY_MS, 600000); /* retired slots stay committed */
    struct medium_keep m = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, medium_keep_run, &m), 0);
    pthread_join(t, NULL);
    cr_assert_eq(m.most, 2, "%u medium slabs of one span kept at once", m.most);
    cr_assert(m.newest, "the kept medium slabs are not the last two emptied");
    /* 64 blocks of 40,000 B, 14 to a slab (5 slabs): all but the active
       and the two kept slabs went back. */
    size_t slab = (size_t)gsi_classes[gsi_size_class(40000)].span * GS_SLOT_SIZE;
    cr_assert_geq(m.retired, 2 * slab, "only %zu KiB of emptied medium slabs retired",
                  m.retired >> 10);
}

/* A block that grows into a larger medium class (as realloc moves it)
   takes the slab its smaller class left empty, active or kept, formatted
   again for the larger class, whose lines are still in the cache; a
   smaller class never takes a larger one's empty active slab (two sizes
   used one block at a time in turn would take each other's slab at every
   turn). In a thread of its own (its heap has no medium slab). Fails with
   a new slab for each class (the rule until the thirty-sixth session). */
struct medium_growth {
    struct gs_slab *small, *grown, *kept, *grown_from_kept, *shrunk;
    unsigned grown_cls;
};

static void *medium_growth_run(void *arg)
{
    struct medium_growth *m = arg;
    void *p = malloc(100000);
    m->small = gsi_slab_of(p);
    free(p); /* the 100,000 B class's active slab, empty */
    void *q = malloc(150000);
    m->grown = gsi_slab_of(q);
    m->grown_cls = m->grown->cls;
    /* Emptied and kept: a slab of the 100,000 B class filled and freed. */
    unsigned cap = gsi_classes[gsi_size_class(100000)].capacity;
    static void *batch[64];
    for (unsigned i = 0; i < 2 * cap; i++)
        batch[i] = malloc(100000);
    struct gs_slab *first = gsi_slab_of(batch[0]);
    for (unsigned i = 0; i < 2 * cap; i++)
        free(batch[i]);
    m->kept = first->where == GS_IN_KEPT ? first : NULL;
    void *r = malloc(200000); /* a class without a slab: takes the kept one */
    m->grown_from_kept = gsi_slab_of(r);
    free(r);
    free(q); /* the 150,000 B and 200,000 B classes' active slabs are empty */
    /* A class of their span below them, and below every other class with
       a slab: only the larger classes' empty slabs would serve it. */
    void *v = malloc(70000);
    m->shrunk = gsi_slab_of(v);
    free(v);
    return NULL;
}

Test(heap, growing_block_takes_the_slab_its_class_left)
{
    struct medium_growth m = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, medium_growth_run, &m), 0);
    pthread_join(t, NULL);
    cr_assert_eq(gsi_classes[gsi_size_class(100000)].span, gsi_classes[m.grown_cls].span);
    cr_assert_eq(m.grown, m.small, "the grown block did not take the empty active slab");
    cr_assert_eq(m.grown_cls, gsi_size_class(150000), "the slab was not formatted again");
    cr_assert_not_null(m.kept, "no emptied slab of the 100,000 B class kept");
    cr_assert_eq(m.grown_from_kept, m.kept, "a new class did not take the kept slab");
    cr_assert_eq(gsi_classes[gsi_size_class(70000)].span, gsi_classes[m.grown_cls].span);
    cr_assert(m.shrunk != m.grown && m.shrunk != m.kept,
              "a smaller class took a larger one's active slab");
}

/* A loop that allocates and frees a medium size in batches of two or three
   slabs' worth, one size, two or three in turn, makes no slab after the
   first rounds: the slabs it empties are kept and serve the next rounds,
   whatever their class. In a thread of its own, whose heap holds no slab
   from before (the test runner's partly used slabs of those classes
   served every round of the main thread's heap whatever the keep). Fails
   with no medium slab kept (a new slab every round: three times slower),
   with two kept of all spans together (40,000 B and 100,000 B take
   each other's place: a slab a round), and, for three sizes of 200..250
   KB, with one slab kept per class and the largest retired first (the
   rule until the thirty-sixth session). */
struct medium_batches {
    size_t size[3];
    unsigned sizes, batch;
    uint32_t made; /* slabs made after the first rounds */
};

static void *medium_batches_run(void *arg)
{
    struct medium_batches *m = arg;
    enum { ROUNDS = 99 };
    void *p[32];
    uint32_t made = 0;
    for (int r = 0; r < ROUNDS; r++) {
        size_t size = m->size[(unsigned)r % m->sizes];
        for (unsigned i = 0; i < m->batch; i++)
            p[i] = malloc(size);
        for (unsigned i = 0; i < m->batch; i++)
            free(p[i]);
        if (r == 8) /* three turns of three sizes: each class has its slabs */
            made = gsi_tls_mine->slabs_made;
    }
    m->made = gsi_tls_mine->slabs_made - made;
    return NULL;
}

static void medium_batches(unsigned batch, size_t a, size_t b, size_t c)
{
    struct medium_batches m = {{a, b, c}, c ? 3 : b ? 2 : 1, batch, 0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, medium_batches_run, &m), 0);
    pthread_join(t, NULL);
    cr_assert_eq(m.made, 0, "%u slabs made in 90 rounds of %u blocks of %zu, %zu and %zu B",
                 m.made, batch, a, b, c);
}

Test(heap, medium_batch_loop_makes_no_slabs)
{
    medium_batches(24, 40000, 0, 0); /* 14 a slab */
}

Test(heap, medium_batches_of_two_sizes_make_no_slabs)
{
    medium_batches(24, 40000, 100000, 0); /* 14 and 9 a slab, two spans */
}

Test(heap, medium_batches_of_three_sizes_make_no_slabs)
{
    medium_batches(8, 200000, 225000, 250000); /* 4 a slab */
}

/* A partial slab whose every object other threads freed is collected by
   the owner's refills of other classes (heap.c, poll_partial_other): a
   heap that never refills its class (its active slab living on the remote
   frees others make into it) held such slabs for good; it now gives them
   back to their segments. One thread fills a
   slab of 2000 B blocks (released when used up); this thread frees one
   of them, taking the slab over; another thread frees the rest; this
   thread then allocates only 64 B blocks. */
struct slab_of_blocks {
    void **blocks;
    size_t n;
};

static void *alloc_2000(void *arg)
{
    struct slab_of_blocks *b = arg;
    for (size_t i = 0; i < b->n; i++)
        b->blocks[i] = malloc(2000);
    return NULL;
}

static void *free_all_but_first(void *arg)
{
    struct slab_of_blocks *b = arg;
    for (size_t i = 1; i < b->n; i++)
        free(b->blocks[i]);
    return NULL; /* the thread's exit pushes its batch of remote frees */
}

Test(heap, partial_slab_freed_by_others_collected_by_other_refills)
{
    unsigned cls = gsi_size_class(2000);
    size_t cap = gsi_classes[cls].capacity;
    /* A slab of the class made active: credit to keep one it empties. */
    void *mine = malloc(2000);
    static void *blocks[1024];
    cr_assert_leq(2 * cap + 1, 1024);
    struct slab_of_blocks b = {.blocks = blocks, .n = 2 * cap + 1};
    run_thread(alloc_2000, &b);
    /* blocks[0]'s slab was used up (the thread went on to another) and
       released; its cap blocks are among those allocated. */
    struct gs_slab *s = gsi_slab_of(blocks[0]);
    size_t in_s = 0;
    for (size_t i = 0; i < b.n; i++)
        in_s += gsi_slab_of(blocks[i]) == s;
    cr_assert_eq(in_s, cap);
    free(blocks[0]);
    struct gs_heap *h = gsi_tls_mine;
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id, "the free did not take it over");
    cr_assert_eq(s->where, GS_IN_PARTIAL);
    run_thread(free_all_but_first, &b);
    cr_assert_eq(GS_X_COUNT(atomic_load(&s->xstate)), cap - 1);
    cr_assert_eq(s->used, cap - 1);
    enum { MAX = 200000 };
    void **p = gst_raw_array(MAX);
    cr_assert_not_null(p);
    size_t n = 0;
    while (n < MAX && s->kind == GS_SLAB_SMALL && s->cls == cls && s->where == GS_IN_PARTIAL)
        cr_assert_not_null(p[n++] = malloc(64));
    cr_assert(s->kind != GS_SLAB_SMALL || s->cls != cls || s->where != GS_IN_PARTIAL,
              "the slab stayed partial, its objects freed, through %zu mallocs", n);
    /* Retired, not kept: its class is one this heap does not refill (its
       slot may hold a 64 B slab since). */
    cr_assert(s->kind != GS_SLAB_SMALL || s->cls != cls, "the emptied slab was kept (where %d)",
              s->where);
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(mine);
}

/* A takeover's look at its class's partial list leaves alone the slab the
   takeover has just put there, which its caller goes on using: when the
   look collected that slab too, a second thread's frees landing between
   the takeover's collect and the look's emptied it under the caller, and
   both retired it ("assertion failed: s->kind == GS_SLAB_SMALL", or with
   asserts off a slab handed to two heaps; a review's race). Per round:
   this thread fills a slab; two threads free half of it each, their
   remote frees batched; this thread uses the slab up (released); the two
   flush at once, the first adopting the slab. A second retire fails the
   segment's assertion (this build's GS_ASSERT_LEVEL is at least 1, checked
   below) and the test crashes. The old code failed within the first rounds
   in 5 of 6 runs (a race: the test cannot force it). */
enum { TAKE_SZ = 2000 };
struct half_freer {
    void **blocks;
    size_t from, to;
    void *other; /* a block of another slab: freeing it flushes the batch */
    _Atomic int *ready, *go;
};

static void *free_half_then_flush(void *arg)
{
    struct half_freer *f = arg;
    free(malloc(64)); /* a heap of its own, with no credit for the class */
    for (size_t i = f->from; i < f->to; i++)
        free(f->blocks[i]); /* the slab is owned: batched */
    atomic_fetch_add(f->ready, 1);
    while (!atomic_load(f->go))
        ; /* both hot when it flips: the race's window is short */
    free(f->other);
    return NULL;
}

Test(heap, takeover_emptied_by_a_racing_free_retired_once, .timeout = 120)
{
    cr_assert_geq(GS_ASSERT_LEVEL, 1, "the test needs the library's assertions");
    unsigned cls = gsi_size_class(TAKE_SZ);
    size_t cap = gsi_classes[cls].capacity;
    static void *blocks[64];
    cr_assert_leq(cap, 64);
    void *next = malloc(TAKE_SZ);
    int rounds = 0;
    double until = gst_now_s() + 3.0;
    while (rounds < 20000 && gst_now_s() < until) {
        free(next);
        blocks[0] = malloc(TAKE_SZ);
        struct gs_slab *s = gsi_slab_of(blocks[0]);
        size_t n = 1;
        while (n < cap && gsi_slab_of(blocks[n] = malloc(TAKE_SZ)) == s)
            n++;
        if (n < cap) { /* not a fresh slab: start again */
            for (size_t i = 0; i <= n && i < cap; i++)
                free(blocks[i]);
            next = malloc(TAKE_SZ);
            continue;
        }
        _Atomic int ready = 0, go = 0;
        struct half_freer a = {blocks, 0, cap / 2, malloc(3000), &ready, &go};
        struct half_freer b = {blocks, cap / 2, cap, malloc(3000), &ready, &go};
        pthread_t ta, tb;
        cr_assert_eq(pthread_create(&ta, NULL, free_half_then_flush, &a), 0);
        cr_assert_eq(pthread_create(&tb, NULL, free_half_then_flush, &b), 0);
        while (atomic_load(&ready) != 2)
            sched_yield();
        next = malloc(TAKE_SZ); /* the slab used up: released */
        atomic_store(&go, 1);
        cr_assert_eq(pthread_join(ta, NULL), 0);
        cr_assert_eq(pthread_join(tb, NULL), 0);
        rounds++;
    }
    free(next);
    cr_assert_gt(rounds, 50, "only %d rounds ran", rounds);
}

/* Empty slabs of class 700 B the calling heap keeps: bytes kept within its
   own bound and bytes charged to the shared budget. */
struct kept { size_t own, shared; };

static struct kept kept_of_class(unsigned cls)
{
    struct kept k = {0, 0};
    for (struct gs_slab *s = gsi_tls_heap->partial[cls].first; s; s = s->next)
        cr_assert_neq(s->used, 0, "empty slab on the partial list, not kept");
    for (struct gs_slab *s = gsi_tls_heap->kept[cls].first; s; s = s->next) {
        cr_assert(s->kept_empty && s->used == 0, "slab on the kept list not kept empty");
        size_t bytes = (size_t)s->span * GS_SLOT_SIZE;
        *(s->kept_shared ? &k.shared : &k.own) += bytes;
    }
    return k;
}

/* 20,000 blocks of 700 B fill about 215 slabs (13 MiB), then all are freed. */
static struct kept churn_700(void)
{
    enum { N = 20000 };
    static __thread void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = malloc(700);
    for (int i = 0; i < N; i++)
        free(p[i]);
    return kept_of_class(gsi_size_class(700));
}

static void *churn_thread(void *arg)
{
    *(struct kept *)arg = churn_700();
    return NULL;
}

/* A worker thread that does its part, then pauses (handshake_pause) while
   the test looks, until handshake_finish lets it go on and joins it. */
struct handshake {
    pthread_barrier_t paused, resumed;
    pthread_t thread;
};

static void handshake_start(struct handshake *hs, void *(*fn)(void *), void *arg)
{
    pthread_barrier_init(&hs->paused, NULL, 2);
    pthread_barrier_init(&hs->resumed, NULL, 2);
    cr_assert_eq(pthread_create(&hs->thread, NULL, fn, arg), 0);
    pthread_barrier_wait(&hs->paused);
}

static void handshake_pause(struct handshake *hs)
{
    pthread_barrier_wait(&hs->paused);
    pthread_barrier_wait(&hs->resumed);
}

static void handshake_finish(struct handshake *hs)
{
    pthread_barrier_wait(&hs->resumed);
    cr_assert_eq(pthread_join(hs->thread, NULL), 0);
    pthread_barrier_destroy(&hs->paused);
    pthread_barrier_destroy(&hs->resumed);
}

/* A consumer: allocates one block of class 700 B (one slab made active),
   then frees blocks another thread allocated, keeping no more than that one
   slab of those it empties; waits while the producer allocates as much
   again; then allocates and frees as many itself, and keeps. */
struct consumer {
    void **blocks;
    size_t n;
    struct handshake hs;
    struct kept freeing, churning;
};

static void *consume_700(void *arg)
{
    struct consumer *c = arg;
    void *mine = malloc(700);
    for (size_t i = 0; i < c->n; i++)
        free(c->blocks[i]);
    c->freeing = kept_of_class(gsi_size_class(700));
    handshake_pause(&c->hs);
    free(mine);
    c->churning = churn_700();
    return NULL;
}

/* bench/prodcons held 2 to 20 MB for 64 KiB in flight while its consumer
   kept the slabs it emptied and its producer mapped new ones. */
Test(heap, consumer_keeps_no_more_than_it_made_active)
{
    enum { N = 20000 }; /* about 215 slabs */
    static void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = malloc(700);
    size_t slab_bytes = (size_t)gsi_slab_of(p[0])->span * GS_SLOT_SIZE;
    struct consumer c = {.blocks = p, .n = N};
    handshake_start(&c.hs, consume_700, &c);
    /* The consumer lives on: what it emptied went back to the segments,
       committed, and the producer allocating as much again maps nothing
       beyond the one slab the consumer may keep. */
    struct gs_stats before, after;
    gs_stats_get(&before);
    for (int i = 0; i < N; i++)
        p[i] = malloc(700);
    gs_stats_get(&after);
    handshake_finish(&c.hs);
    cr_assert_leq(c.freeing.own + c.freeing.shared, slab_bytes,
                  "a thread that made one slab of the class active kept %zu bytes of its "
                  "own and %zu shared",
                  c.freeing.own, c.freeing.shared);
    cr_assert_leq(after.mapped_bytes, before.mapped_bytes + slab_bytes,
                  "the producer mapped %zu KiB more to allocate what it had freed",
                  (after.mapped_bytes - before.mapped_bytes) >> 10);
    cr_assert_gt(c.churning.own, 0, "the same thread kept nothing once it allocated the class");
    for (int i = 0; i < N; i++)
        free(p[i]);
}

/* A consumer that never allocates the class: frees 7 of every 8 blocks
   another thread allocated (the eighth lives on), then waits while that
   thread allocates as many as it freed. The holes must be reusable by the
   allocating thread: the consumer keeps only a few of the slabs it took
   over, the rest wait on the orphan list, and the producer refills from
   them instead of mapping new slabs (it mapped a new slab for every 224
   blocks when the consumer kept them all: 16.5 MB live, 119 MB peak RSS
   in a helper's program where a thread freed the entries another
   replaced). */
struct holes {
    void **blocks;
    size_t n;
    bool allocates; /* the consumer allocates one block of the class first */
    size_t partial; /* the consumer's partial slabs of the class after */
    struct handshake hs;
};

static void *free_7_of_8(void *arg)
{
    struct holes *c = arg;
    void *mine = c->allocates ? malloc(256) : NULL;
    for (size_t i = 0; i < c->n; i++)
        if (i % 8) {
            free(c->blocks[i]);
            c->blocks[i] = NULL;
        }
    c->partial = gsi_tls_mine->partial[gsi_size_class(256)].count;
    handshake_pause(&c->hs);
    free(mine);
    return NULL;
}

static void check_holes_reused(bool consumer_allocates)
{
    enum { N = 64 * 256 }; /* 64 slabs of 256-byte blocks */
    static void *p[N], *q[N];
    for (int i = 0; i < N; i++)
        cr_assert_not_null(p[i] = malloc(256));
    size_t slab_bytes = (size_t)gsi_slab_of(p[0])->span * GS_SLOT_SIZE;
    struct holes c = {.blocks = p, .n = N, .allocates = consumer_allocates};
    handshake_start(&c.hs, free_7_of_8, &c);
    struct gs_stats before, after;
    gs_stats_get(&before);
    size_t nq = 0;
    for (int i = 0; i < N * 3 / 4; i++)
        cr_assert_not_null(q[nq++] = malloc(256));
    gs_stats_get(&after);
    handshake_finish(&c.hs);
    cr_assert_leq(c.partial, 16, "the consumer kept %zu partly used slabs", c.partial);
    cr_assert_leq(after.mapped_bytes, before.mapped_bytes + slab_bytes,
                  "the allocating thread mapped %zu KiB more with the holes of %d blocks free",
                  (after.mapped_bytes - before.mapped_bytes) >> 10, N * 7 / 8);
    cr_assert_leq(after.slabs, before.slabs + 1, "%zu slabs made for the holes' worth",
                  after.slabs - before.slabs);
    for (size_t i = 0; i < nq; i++)
        free(q[i]);
    for (int i = 0; i < N; i++)
        free(p[i]);
}

Test(heap, consumer_leaves_its_holes_to_the_allocating_thread)
{
    check_holes_reused(false);
}

/* The same when the consumer allocates the class too (a pool's worker
   that frees the producers' blocks and allocates results of its own):
   it reuses the holes only as fast as it allocates. */
Test(heap, allocating_consumer_leaves_its_holes_too)
{
    check_holes_reused(true);
}

/* With nobody allocating the class, a heap freeing another's blocks stops
   shedding the slabs it takes over once its credit is spent (a thread that
   frees, in a random order, the million blocks another thread built and
   keeps: every free took over a slab and shed another, 5.6 times slower).
   The producer allocates, then only waits; the consumer frees all but the
   first block of each of 1200 slabs, one block per slab in turn. */
enum { PP_SLABS = 1200 };
struct pingpong {
    void **blocks;
    size_t cap;
    size_t partial;
};

static void *free_across_slabs(void *arg)
{
    struct pingpong *c = arg;
    for (size_t r = 1; r < c->cap; r++)
        for (size_t k = 0; k < PP_SLABS; k++)
            free(c->blocks[k * c->cap + r]);
    c->partial = gsi_tls_mine->partial[gsi_size_class(256)].count;
    return NULL;
}

Test(heap, no_shedding_without_demand, .timeout = 60)
{
    size_t cap = gsi_classes[gsi_size_class(256)].capacity;
    size_t n = PP_SLABS * cap;
    void **p = gst_raw_array(n);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++)
        cr_assert_not_null(p[i] = malloc(256));
    for (size_t k = 0; k < PP_SLABS; k++)
        cr_assert_eq(gsi_slab_of(p[k * cap]), gsi_slab_of(p[k * cap + cap - 1]),
                     "slab %zu not filled in order", k);
    struct pingpong c = {.blocks = p, .cap = cap};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_across_slabs, &c), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_geq(c.partial, PP_SLABS - 100,
                  "the consumer kept %zu of %d slabs: it went on shedding", c.partial,
                  PP_SLABS);
    for (size_t k = 0; k < PP_SLABS; k++)
        free(p[k * cap]);
}

/* Beyond its own 2 MiB, a heap keeps empty slabs from a budget all heaps
   share (here 4 MiB) and retires the rest. While one heap holds the whole
   budget another keeps only its own 2 MiB; malloc_trim gives the kept
   slabs back, and the budget with them. */
Test(heap, shared_keep_bounded_for_all_heaps)
{
    gsi_option_set(GSI_OPT_HEAP_SHARED_KEEP_MB, 4);
    struct kept k = churn_700();
    cr_assert_leq(k.own, gsi_tls_heap->empty_bytes);
    cr_assert_leq(gsi_tls_heap->empty_bytes, (size_t)2 << 20);
    cr_assert_gt(k.shared, (size_t)3 << 20, "only %zu bytes kept from the shared budget", k.shared);
    cr_assert_leq(k.shared, (size_t)4 << 20);

    struct kept other;
    run_thread(churn_thread, &other);
    cr_assert_eq(other.shared, 0, "a second heap kept %zu bytes past an exhausted budget",
                 other.shared);
    cr_assert_gt(other.own, 0, "the second heap kept nothing of its own");

    malloc_trim(0);
    k = kept_of_class(gsi_size_class(700));
    cr_assert_eq(k.own + k.shared, 0, "malloc_trim left %zu bytes kept", k.own + k.shared);
    run_thread(churn_thread, &other);
    cr_assert_gt(other.shared, (size_t)3 << 20, "the budget did not come back after trim");
}

/* The heaps' own keeps are bounded together too (here 4 MiB): eight live
   threads that each free 13 MiB keep at most 4 MiB of their own between
   them, not 2 MiB each; what a heap could not keep of its own it took
   from the shared budget or retired. When they exit, their keeps are
   dropped from the total. */
static pthread_barrier_t own_keep_barrier;

static void *churn_and_wait(void *arg)
{
    *(struct kept *)arg = churn_700();
    pthread_barrier_wait(&own_keep_barrier); /* kept: main checks */
    pthread_barrier_wait(&own_keep_barrier); /* then exit */
    return NULL;
}

Test(heap, own_keeps_bounded_for_all_heaps)
{
    enum { T = 8 };
    malloc_trim(0);
    size_t before = gsi_heap_own_kept_bytes();
    gsi_option_set(GSI_OPT_HEAP_EMPTY_TOTAL_MB, before / (1 << 20) + 4);
    size_t cap = ((before >> 20) + 4) << 20;
    pthread_t t[T];
    struct kept k[T];
    cr_assert_eq(pthread_barrier_init(&own_keep_barrier, NULL, T + 1), 0);
    for (int i = 0; i < T; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, churn_and_wait, &k[i]), 0);
    pthread_barrier_wait(&own_keep_barrier);
    size_t own = 0;
    for (int i = 0; i < T; i++) {
        cr_assert_leq(k[i].own, (size_t)2 << 20, "thread %d kept %zu bytes of its own", i,
                      k[i].own);
        own += k[i].own;
    }
    size_t total = gsi_heap_own_kept_bytes();
    pthread_barrier_wait(&own_keep_barrier);
    for (int i = 0; i < T; i++)
        cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_gt(own, 0, "no heap kept anything of its own");
    cr_assert_leq(total, cap, "heaps keep %zu KiB of their own together, bound %zu KiB",
                  total >> 10, cap >> 10);
    cr_assert_leq(before + own, cap, "the eight heaps kept %zu KiB of their own (bound %zu KiB)",
                  own >> 10, (cap - before) >> 10);
    cr_assert_eq(gsi_heap_own_kept_bytes(), before,
                 "exited heaps' keeps still counted: %zu KiB, %zu before",
                 gsi_heap_own_kept_bytes() >> 10, before >> 10);
    gsi_option_set(GSI_OPT_HEAP_EMPTY_TOTAL_MB, 32);
    pthread_barrier_destroy(&own_keep_barrier);
}

/* The active slab does not count mallocs (advance charge); when it stops
   being active its count is exact again: a slab filled completely, with
   frees and reallocations while it was active, counts capacity objects,
   and a later free moves it to the partial list with capacity - 1. */
Test(heap, active_slab_recounted_when_replaced)
{
    enum { MAX = 2000 };
    static void *p[MAX];
    unsigned cls = gsi_size_class(2900);
    int n = 0;
    p[n++] = malloc(2900);
    struct gs_slab *a = gsi_slab_of(p[0]);
    cr_assert_eq(gsi_tls_heap->active[cls], a);
    /* Fill a, freeing and reallocating some objects along the way. */
    while (gsi_tls_heap->active[cls] == a) {
        cr_assert_lt(n, MAX);
        p[n++] = malloc(2900);
        if (n % 4 == 0) {
            free(p[n - 2]);
            p[n - 2] = malloc(2900);
        }
    }
    /* The last malloc came from the next slab; a is full and not active. */
    cr_assert_neq(a->where, GS_IN_ACTIVE);
    cr_assert_eq(a->free_head, GS_LINK_END);
    cr_assert_eq(a->bump, a->capacity);
    cr_assert_eq(a->used, a->capacity, "count after leaving the active slot");
    int mine = -1;
    for (int i = 0; i < n && mine < 0; i++)
        if (gsi_slab_of(p[i]) == a)
            mine = i;
    cr_assert_geq(mine, 0);
    free(p[mine]);
    p[mine] = NULL;
    cr_assert_eq(a->used, a->capacity - 1);
    cr_assert_eq(a->where, GS_IN_PARTIAL);
    cr_assert_eq(gsi_slab_recount(a), a->used);
    for (int i = 0; i < n; i++)
        free(p[i]);
}

/* Should the active slab's advance charge ever run out (2^62 frees), the
   free that takes it to zero charges it again: the slab stays active,
   nothing is retired, and its lists still count right. Simulated by
   setting the count to 1. */
Test(heap, active_slab_charge_renewed)
{
    void *p = malloc(3000), *q = malloc(3000);
    struct gs_slab *a = gsi_slab_of(q);
    unsigned cls = gsi_size_class(3000);
    cr_assert_eq(gsi_tls_heap->active[cls], a);
    uint64_t live = gsi_slab_recount(a);
    a->used = 1;
    free(q);
    cr_assert_eq(gsi_tls_heap->active[cls], a, "active slab dropped when its charge ran out");
    cr_assert_eq(a->where, GS_IN_ACTIVE);
    cr_assert_eq(a->kind, GS_SLAB_SMALL, "active slab retired");
    cr_assert_eq(gsi_slab_recount(a), live - 1);
    cr_assert_geq(a->used, GS_ACTIVE_CHARGE);
    void *r = malloc(3000);
    cr_assert_eq(r, q, "freed object not reused from the same slab");
    free(r);
    free(p);
}

/* fork: in the child, the heaps of threads that did not survive are no
   longer live, the locks are usable, and allocation works. */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int hold_has_heap;
static void *hold_heap(void *arg)
{
    (void)arg;
    void *p = malloc(64);
    atomic_store(&hold_has_heap, 1);
    pthread_mutex_lock(&hold_lock);
    pthread_mutex_unlock(&hold_lock);
    free(p);
    return NULL;
}

static void fork_child(void *arg)
{
    (void)arg;
    size_t n[2];
    count_heaps(n);
    if (n[1] != 1)
        _exit(10);
    void *ptrs[1000];
    for (int i = 0; i < 1000; i++)
        if (!(ptrs[i] = malloc((size_t)i * 37 % 5000 + 1)))
            _exit(11);
    for (int i = 0; i < 1000; i++)
        free(ptrs[i]);
    _exit(0);
}

Test(heap, fork_abandons_other_threads_heaps)
{
    free(malloc(64));
    pthread_t t;
    pthread_mutex_lock(&hold_lock);
    cr_assert_eq(pthread_create(&t, NULL, hold_heap, NULL), 0);
    for (int i = 0; i < 10000 && !atomic_load(&hold_has_heap); i++)
        gst_sleep_ms(1);
    size_t n[2];
    count_heaps(n);
    cr_assert_geq(n[1], 2);
    struct gst_child c;
    cr_assert(gst_run_child(fork_child, NULL, &c));
    pthread_mutex_unlock(&hold_lock);
    pthread_join(t, NULL);
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0,
              "child status %#x (10: other heaps still live), stderr: %s", c.status, c.err);
}

/* ------------------------------------------------------------ owner keys */

/* A thread's heap is keyed by its thread pointer, and so are the slabs it
   owns: what the free fast path compares with %fs:0. */
static void *record_key(void *arg)
{
    uintptr_t *out = arg;
    void *p = malloc(48);
    out[0] = gsi_tls_mine->key;
    out[1] = (uintptr_t)__builtin_thread_pointer();
    out[2] = atomic_load(&gsi_slab_of(p)->owner_key);
    free(p);
    return NULL;
}

Test(heap, keyed_by_thread_pointer)
{
    uintptr_t k[3];
    record_key(k);
    cr_assert_eq(k[0], k[1], "main heap key %#lx, thread pointer %#lx", k[0], k[1]);
    cr_assert_eq(k[2], k[1], "slab owner key %#lx", k[2]);
    run_thread(record_key, k);
    cr_assert_eq(k[0], k[1], "thread heap key %#lx, thread pointer %#lx", k[0], k[1]);
    cr_assert_eq(k[2], k[1], "slab owner key %#lx", k[2]);
}

/* A destructor that runs after graceslab's (a later pthread key) allocates:
   the heap made then may outlive the thread, so it must not carry the
   thread pointer (a later thread given the same thread pointer would take
   its slabs for its own), and graceslab's destructor, run again by glibc,
   abandons it. The block is then freed by another thread whose thread
   pointer is most likely the dead one's (glibc reuses stacks). */
static pthread_key_t late_key;
static void *late_block;
static uintptr_t late_heap_key, late_thread_ptr;

static void late_destructor(void *arg)
{
    (void)arg;
    late_block = malloc(64);
    memset(late_block, 0x5a, 64);
    late_heap_key = gsi_tls_mine->key;
    late_thread_ptr = (uintptr_t)__builtin_thread_pointer();
}

static void *start_late(void *arg)
{
    free(malloc(64)); /* a heap, so graceslab's destructor has work */
    pthread_setspecific(late_key, arg);
    return NULL;
}

static void *free_late(void *arg)
{
    uintptr_t *same = arg;
    *same = (uintptr_t)__builtin_thread_pointer() == late_thread_ptr;
    for (int i = 0; i < 64; i++)
        cr_assert_eq(((unsigned char *)late_block)[i], 0x5a);
    free(late_block);
    void *again[64];
    for (int i = 0; i < 64; i++)
        again[i] = malloc(64);
    for (int i = 0; i < 64; i++)
        free(again[i]);
    return NULL;
}

Test(heap, heap_made_by_exiting_thread_not_keyed_by_it)
{
    free(malloc(1)); /* graceslab initialised: its key is older than late_key */
    cr_assert_eq(pthread_key_create(&late_key, late_destructor), 0);
    run_thread(start_late, (void *)1);
    cr_assert_not_null(late_block);
    cr_assert_neq(late_heap_key, late_thread_ptr, "late heap keyed by the exiting thread");
    cr_assert_neq(late_heap_key, 0);
    struct gs_slab *s = gsi_slab_of(late_block);
    cr_assert_eq(atomic_load(&s->owner_key), 0, "late heap not abandoned (owner key %#lx)",
                 atomic_load(&s->owner_key));
    uintptr_t same = 0;
    run_thread(free_late, &same);
    cr_log_info("freeing thread had the exited thread's pointer: %s", same ? "yes" : "no");
}

/* A thread that allocates for the first time in the last round of
   thread-specific destructors: glibc runs no further round, so graceslab's
   destructor never abandons that heap, which stays live, keyed by the dead
   thread's pointer. The next thread given that pointer (the same
   user-supplied stack gives the same one) must not treat it as its own
   heap: its first heap creation, or a fast-path free that empties one of
   the dead heap's (non-active) slabs, abandons the dead heap.
   A thread that had allocated before its destructors ran had its first
   heap abandoned in the first round; the heap it makes in the last round
   is keyed by its address, not the thread pointer, and the next thread on
   that pointer abandons it when it makes its own heap. */
enum { MAX_DEAD = 8192 };
static pthread_key_t round_key;
static void *dead_blocks[MAX_DEAD];
static size_t dead_n; /* blocks 1..dead_n-1 are the rest of one partial slab */
static uintptr_t dead_heap_key, dead_tp;
static struct gs_heap *dead_heap;

static void round_destructor(void *arg)
{
    uintptr_t round = (uintptr_t)arg;
    if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
        pthread_setspecific(round_key, (void *)(round + 1));
        return;
    }
    /* Fill one slab (released when full) and start the next; freeing one
       block of the full one takes it back as a partial slab. */
    size_t cap = gsi_classes[gsi_size_class(64)].capacity;
    for (size_t i = 0; i <= cap && i < MAX_DEAD; i++)
        dead_blocks[i] = malloc(64);
    free(dead_blocks[0]);
    dead_n = cap;
    dead_heap = gsi_tls_mine;
    dead_heap_key = gsi_tls_mine->key;
    dead_tp = (uintptr_t)__builtin_thread_pointer();
}

static void *start_rounds(void *arg)
{
    if (arg) /* a first heap, abandoned in the first round */
        free(malloc(64));
    pthread_setspecific(round_key, (void *)1);
    return NULL;
}

struct after_dead {
    uintptr_t tp;
    bool by_malloc; /* make a heap first (else only free) */
    bool dead_live_after_malloc, dead_live_after;
};

static void *follow_dead(void *arg)
{
    struct after_dead *a = arg;
    a->tp = (uintptr_t)__builtin_thread_pointer();
    if (a->by_malloc) {
        free(malloc(100));
        a->dead_live_after_malloc = dead_heap->live;
    }
    for (size_t i = 1; i < dead_n; i++)
        free(dead_blocks[i]);
    a->dead_live_after = dead_heap->live;
    return NULL;
}

static void run_on_stack(void *stack, size_t size, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_t t;
    cr_assert_eq(pthread_attr_init(&attr), 0);
    cr_assert_eq(pthread_attr_setstack(&attr, stack, size), 0);
    cr_assert_eq(pthread_create(&t, &attr, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    pthread_attr_destroy(&attr);
}

/* by_malloc: the next thread makes a heap before freeing; late: the dead
   thread had a heap before its destructors ran. */
static void dead_heap_case(bool by_malloc, bool late)
{
    free(malloc(1));
    cr_assert_eq(pthread_key_create(&round_key, round_destructor), 0);
    size_t size = (size_t)1 << 20;
    void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(stack, MAP_FAILED);
    run_on_stack(stack, size, start_rounds, late ? stack : NULL);
    cr_assert_gt(dead_n, 2);
    /* The situation this is about: a live heap of a dead thread, keyed by
       that thread's pointer (or by its own address if late), owning a
       partial slab. */
    uintptr_t want_key = late ? (uintptr_t)dead_heap : dead_tp;
    cr_assert_eq(dead_heap_key, want_key);
    cr_assert(dead_heap->live, "the last-round heap was abandoned after all");
    struct gs_slab *s = gsi_slab_of(dead_blocks[1]);
    for (size_t i = 2; i < dead_n; i++)
        cr_assert_eq(gsi_slab_of(dead_blocks[i]), s, "blocks not from one slab");
    cr_assert_eq(atomic_load(&s->owner_key), want_key);
    cr_assert_eq(s->where, GS_IN_PARTIAL);
    struct after_dead a = {.by_malloc = by_malloc};
    run_on_stack(stack, size, follow_dead, &a);
    cr_assert_eq(a.tp, dead_tp, "a thread on the same stack got another thread pointer");
    cr_assert(!a.dead_live_after_malloc, "the dead thread's heap outlived the new heap");
    cr_assert(!a.dead_live_after, "the dead thread's heap is still live");
    cr_assert_neq(atomic_load(&s->owner_key), want_key, "a slab still keyed by a dead heap");
    /* Everything still works. */
    static void *p[MAX_DEAD];
    for (size_t i = 0; i < dead_n; i++)
        cr_assert_not_null(p[i] = malloc(64));
    for (size_t i = 0; i < dead_n; i++)
        free(p[i]);
}

Test(heap, dead_heap_abandoned_by_next_thread_heap)
{
    dead_heap_case(true, false);
}

Test(heap, dead_heap_abandoned_by_emptying_free)
{
    dead_heap_case(false, false);
}

Test(heap, late_dead_heap_abandoned_by_next_thread_heap)
{
    dead_heap_case(true, true);
}

/* Forks while another thread stands still halfway through an operation:
   the thread calls stop_here(ok) at that point (ok false: the operation
   itself failed), fork_while_stopped() runs check in a forked child while
   it waits there, then lets it finish. */
static pthread_mutex_t stop_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stop_cond = PTHREAD_COND_INITIALIZER;
static int stop_stage; /* 0 running, 1 stopped, -1 stopped after a failure, 2 go on */

static void stop_here(bool ok)
{
    pthread_mutex_lock(&stop_lock);
    stop_stage = ok ? 1 : -1;
    pthread_cond_broadcast(&stop_cond);
    while (stop_stage != 2)
        pthread_cond_wait(&stop_cond, &stop_lock);
    pthread_mutex_unlock(&stop_lock);
}

static void fork_while_stopped(void *(*thread)(void *), void *arg, void (*check)(void *),
                               void *check_arg)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, thread, arg), 0);
    pthread_mutex_lock(&stop_lock);
    while (stop_stage == 0)
        pthread_cond_wait(&stop_cond, &stop_lock);
    int stage = stop_stage;
    pthread_mutex_unlock(&stop_lock);
    struct gst_child c = {0};
    bool forked = stage == 1 && gst_run_child(check, check_arg ? check_arg : arg, &c);
    pthread_mutex_lock(&stop_lock);
    stop_stage = 2;
    pthread_cond_broadcast(&stop_cond);
    pthread_mutex_unlock(&stop_lock);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(stage, 1, "the operation before the stop failed");
    cr_assert(forked, "fork failed");
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0, "child status %#x: %s",
              c.status, c.err);
}

/* In a fork child: n blocks of size can be allocated and freed. */
static void child_allocates(size_t size, int n)
{
    void *p[300];
    if (n > 300)
        gst_child_fail("at most 300 blocks");
    for (int i = 0; i < n; i++)
        if (!(p[i] = malloc(size)))
            gst_child_fail("malloc failed");
    for (int i = 0; i < n; i++)
        free(p[i]);
}

/* Fork while a thread holds a slab it adopted but has not listed yet (here
   it stops right after the adoption): abandoning that thread's heap in the
   child does not see the slab, so the child releases it (no owner id, no
   key) and it is an orphan like any other. */
static void *orphan_blocks[200];

static void *make_orphan(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++)
        orphan_blocks[i] = malloc(64);
    for (int i = 0; i < 200; i += 2)
        free(orphan_blocks[i]);
    return NULL; /* exit: the slab (free and allocated objects) is orphaned */
}

static void *adopt_unlisted(void *arg)
{
    struct gs_slab *s = arg;
    struct gs_heap *h = gsi_heap_get();
    bool ok = gsi_slab_adopt(h, s);
    stop_here(ok);
    if (ok) { /* put it back as it was */
        gsi_slab_release(h, s);
        gsi_orphan_push(s, 0);
    }
    return NULL;
}

static void check_rescued(void *arg)
{
    struct gs_slab *s = arg;
    uint64_t x = atomic_load(&s->xstate);
    if (GS_X_OWNER(x) != 0 && GS_X_OWNER(x) != gsi_tls_mine->id)
        gst_child_fail("slab still owned by heap id %u", (unsigned)GS_X_OWNER(x));
    if (atomic_load(&s->owner_key) != 0 && atomic_load(&s->owner_key) != gsi_tls_mine->key)
        gst_child_fail("slab still keyed %#lx", (unsigned long)atomic_load(&s->owner_key));
    free(orphan_blocks[1]); /* its blocks can be freed and reallocated */
    child_allocates(64, 300);
}

Test(heap, fork_releases_slab_adopted_but_not_listed)
{
    free(malloc(64));
    run_thread(make_orphan, NULL);
    struct gs_slab *s = gsi_slab_of(orphan_blocks[1]);
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), 0, "the slab was not orphaned");
    fork_while_stopped(adopt_unlisted, s, check_rescued, NULL);
}

/* A heap taken from the pool starts with every active and direct entry
   empty, whatever its last thread left there (a fork child abandons the
   heap of a thread that vanished halfway through changing them): here a
   stale direct[] entry names a fake slab with one free object, which a
   malloc through a heap that kept it would return. */
static struct gs_heap *pooled_heap;
static char fake_object[128];
static struct gs_slab fake_slab;
static uint16_t fake_links[2] = {GS_LINK_END, GS_LINK_INVALID};

static void *note_heap(void *arg)
{
    (void)arg;
    free(malloc(80));
    pooled_heap = gsi_tls_mine;
    return NULL;
}

static void *malloc_80(void *arg)
{
    void **out = arg;
    free(malloc(16)); /* takes the heap from the pool (slow path) */
    out[0] = malloc(80); /* fast path: direct[] as the pool left it */
    out[1] = gsi_tls_mine;
    free(out[0]);
    return NULL;
}

Test(heap, pooled_heap_starts_empty)
{
    free(malloc(1));
    run_thread(note_heap, NULL);
    cr_assert_not_null(pooled_heap);
    cr_assert(!pooled_heap->live);
    fake_slab.link = fake_links;
    fake_slab.start = fake_object;
    fake_slab.free_ptr = fake_object;
    fake_slab.free_head = 0;
    fake_slab.obj_size = 80;
    pooled_heap->direct[(80 + 15) >> 4] = &fake_slab;
    void *got[2];
    run_thread(malloc_80, got);
    cr_assert_eq(got[1], pooled_heap, "the next thread did not get the pooled heap");
    cr_assert_neq(got[0], (void *)fake_object, "malloc used a stale direct[] entry");
}

/* Fork while a thread holds a slab gsi_slab_new made for it but has not
   taken yet: the child retires it (nobody could ever free into it). */
static struct gs_slab *fresh_slab;

static void *hold_fresh(void *arg)
{
    (void)arg;
    free(malloc(16)); /* this thread's heap */
    struct gs_slab *s = gsi_slab_new(gsi_size_class(48), false, 0);
    fresh_slab = s; /* published by stop_here's lock */
    stop_here(s && s->kind == GS_SLAB_SMALL);
    if (s)
        gsi_slab_retire(s); /* never taken: give it back */
    return NULL;
}

static void check_fresh_retired(void *arg)
{
    (void)arg;
    struct gs_slab *s = fresh_slab;
    if (s->kind == GS_SLAB_SMALL)
        gst_child_fail("a slab made for a lost thread is still a live slab");
    child_allocates(48, 64);
}

Test(heap, fork_retires_slab_made_but_not_taken)
{
    free(malloc(64));
    fork_while_stopped(hold_fresh, NULL, check_fresh_retired, NULL);
}

/* malloc finds every small size's slab through direct[]: right after a
   malloc of each size, the entry that size indexes names the active slab
   of the size's class, and the block came from that slab. Medium sizes
   (no direct[] entry) come from their class's active slab too. */
Test(heap, direct_entries_follow_the_active_slabs)
{
    for (size_t size = 1; size <= GS_SMALL_MAX; size += size < 1024 ? 1 : 61) {
        void *p = malloc(size);
        cr_assert_not_null(p);
        struct gs_heap *h = gsi_tls_mine;
        unsigned c = gsi_size_class(size);
        cr_assert_geq(gsi_classes[c].size, size);
        size_t i = GS_DIRECT_INDEX(size);
        if (size <= GS_DIRECT_MAX)
            cr_assert_eq(h->direct[i], h->active[c],
                         "size %zu: direct[%zu] is not class %u's active slab", size, i, c);
        cr_assert_eq(gsi_slab_of(p), h->active[c], "size %zu: block not from the active slab", size);
        free(p);
    }
}

/* A pending chain keeps 40 bits of its cookie. A process whose grace-period
   sequence passed 2^40 (about a day of back-to-back grace periods) once
   read every stored cookie as long done: objects deferred under a reader
   were handed out again while it read them. In a child, with the sequence
   set just below 2^40 (no reader or grace period is active there). */
static void defer_across_2_40(void *arg)
{
    (void)arg;
    atomic_store(&gsi_gp_seq, ((uint64_t)1 << 40) - 2);
    enum { N = 2048 };
    void **p = gst_raw_array(N);
    for (int i = 0; i < N; i++)
        p[i] = gs_malloc(64);
    struct gst_held_reader r;
    if (!gst_reader_hold(&r))
        gst_child_fail("pthread_create");
    for (int i = 0; i < N; i++)
        gs_free_rcu(p[i]); /* the reader may still hold any of them */
    for (int i = 0; i < N; i++) {
        void *q = gs_malloc(64);
        for (int k = 0; k < N; k++)
            if (q == p[k])
                gst_child_fail("object %d handed out again under its reader (sequence %#lx)", k,
                               (unsigned long)atomic_load(&gsi_gp_seq));
    }
    gst_reader_release(&r);
    /* After the reader: the grace period ends and they come back (the
       engine's background thread, kicked by the refills above, may sweep
       some of them itself: the statistics count every sweep). */
    struct gs_stats st;
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    if (st.pending_objects)
        gst_child_fail("%zu deferred objects not reclaimed after the reader left",
                       st.pending_objects);
    exit(0);
}

Test(heap, deferred_objects_wait_when_the_sequence_passes_2_40, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(defer_across_2_40, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "defer across 2^40");
}

/* Fork while a thread stands between two stores of a list update: here
   gsi_heap_list_remove() of the first slab B of a list [B, A] (partial;
   or kept, both empty) has set the list's first to A, but not yet A's prev
   to NULL. A fork finds a
   running thread in such a state whenever its next store goes to a page
   fork has already copied (the store waits for the fork to end), e.g. the
   segment header holding A, copied before the heap. The child must not walk
   that list: abandoning A left A first on it (its stale prev made the
   removal skip the list head), and A was abandoned a second time —
   released twice (owner assertion in gsi_slab_release) or, empty, retired
   twice (kind assertion in gsi_slab_retire). */
#define TORN_MAX 8192
static void *torn_blocks[TORN_MAX];
static struct gs_slab *torn_a, *torn_b;

static void *torn_list_remove(void *arg)
{
    bool a_empty = arg != NULL;
    struct gs_heap *h = gsi_heap_get();
    unsigned cls = gsi_size_class(64);
    /* Fill two slabs (each released when full) and start a third. */
    struct gs_slab *slabs[3] = {NULL, NULL, NULL};
    int first[3] = {0, 0, 0}, n = 0, k = -1;
    while (n < TORN_MAX) {
        void *p = malloc(64);
        struct gs_slab *s = gsi_slab_of(p);
        if (k < 0 || s != slabs[k]) {
            if (++k == 3) {
                free(p);
                break;
            }
            slabs[k] = s;
            first[k] = n;
        }
        torn_blocks[n++] = p;
    }
    torn_a = slabs[0];
    torn_b = slabs[1];
    /* One free into each: adopted again and pushed on the partial list.
       A takeover also moves the partial slab looked at longest ago to the
       front (poll_partial), so the list is [A, B] or [B, A]. */
    free(torn_blocks[first[0]]);
    torn_blocks[first[0]] = NULL;
    free(torn_blocks[first[1]]);
    torn_blocks[first[1]] = NULL;
    struct gs_slab_list *l = &h->partial[cls];
    if (a_empty) { /* both emptied: kept, on the kept list [A, B] */
        for (int i = first[0]; i < first[2]; i++) {
            free(torn_blocks[i]);
            torn_blocks[i] = NULL;
        }
        l = &h->kept[cls];
    }
    struct gs_slab *x = l->first, *y = x ? x->next : NULL;
    bool ok = x && y && y->prev == x && y->next == NULL &&
              ((x == torn_a && y == torn_b) || (x == torn_b && y == torn_a)) &&
              x->kept_empty == a_empty && y->kept_empty == a_empty;
    if (ok)
        l->first = y; /* gsi_heap_list_remove(l, x), first store only */
    stop_here(ok);
    if (ok) { /* the rest of the removal, then x back on the list */
        y->prev = NULL;
        x->next = x->prev = NULL;
        l->count--;
        gsi_heap_list_push(l, x);
    }
    for (int i = 0; i < n; i++)
        free(torn_blocks[i]);
    return NULL;
}

static void check_torn(void *arg)
{
    (void)arg;
    /* Reaching here: atfork_child did not abort. */
    struct gs_slab *s[2] = {torn_a, torn_b};
    for (int i = 0; i < 2; i++) {
        uint64_t x = atomic_load(&s[i]->xstate);
        if (s[i]->kind == GS_SLAB_SMALL && GS_X_OWNER(x) != 0 &&
            GS_X_OWNER(x) != gsi_tls_mine->id)
            gst_child_fail("slab still owned by heap id %u", (unsigned)GS_X_OWNER(x));
    }
    /* The inherited blocks can be freed, and the memory reused. */
    for (int i = 0; i < TORN_MAX; i++)
        if (torn_blocks[i])
            free(torn_blocks[i]);
    child_allocates(64, 300);
}

Test(heap, fork_with_list_update_half_done)
{
    free(malloc(64));
    fork_while_stopped(torn_list_remove, NULL, check_torn, NULL);
}

Test(heap, fork_with_list_update_half_done_empty_slab)
{
    free(malloc(64));
    fork_while_stopped(torn_list_remove, (void *)1, check_torn, NULL);
}

/* Fork while a thread stands inside gsi_slab_extend() of its active slab:
   the new objects are linked and made the list head, bump is not yet
   advanced. Counted against the old bump the slab looked emptier than it
   was, and the child's next extend linked those objects a second time:
   two owners for one object. The child must repair bump; then its blocks
   are distinct and the inherited ones keep their contents. */
#define TE_SIZE 176
#define TE_LIVE 8
static void *te_live[TE_LIVE];

static void *torn_extend(void *arg)
{
    (void)arg;
    for (int i = 0; i < TE_LIVE; i++) {
        te_live[i] = malloc(TE_SIZE);
        gst_fill(te_live[i], TE_SIZE, (uintptr_t)i + 1);
    }
    struct gs_slab *s = gsi_slab_of(te_live[0]);
    bool ok = gsi_tls_heap->direct[(TE_SIZE + 15) >> 4] == s && s->capacity - s->bump >= 2;
    for (int i = 1; i < TE_LIVE; i++)
        ok = ok && gsi_slab_of(te_live[i]) == s;
    uint32_t n = 0;
    if (ok) { /* gsi_slab_extend(s, 64) up to, not including, bump += n */
        n = s->capacity - s->bump < 64 ? s->capacity - s->bump : 64;
        uint32_t first = s->bump, last = first + n - 1;
        for (uint32_t i = first; i < last; i++)
            gsi_link_store(s, i, (uint16_t)(i + 1));
        gsi_link_store(s, last, (uint16_t)s->free_head);
        gsi_slab_set_head(s, first);
    }
    stop_here(ok);
    if (ok)
        s->bump += n;
    for (int i = 0; i < TE_LIVE; i++)
        free(te_live[i]);
    return NULL;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static void check_torn_extend(void *arg)
{
    (void)arg;
    enum { N = 3000 };
    static void *got[N + TE_LIVE];
    for (int i = 0; i < N; i++) {
        if (!(got[i] = malloc(TE_SIZE)))
            gst_child_fail("malloc failed");
        memset(got[i], 0xEE, TE_SIZE);
    }
    for (int i = 0; i < TE_LIVE; i++) {
        got[N + i] = te_live[i];
        if (gst_check(te_live[i], TE_SIZE, (uintptr_t)i + 1) != TE_SIZE)
            gst_child_fail("inherited block %d overwritten", i);
    }
    qsort(got, N + TE_LIVE, sizeof got[0], cmp_ptr);
    for (int i = 1; i < N + TE_LIVE; i++)
        if (got[i] == got[i - 1])
            gst_child_fail("block %p handed out twice (or an inherited live one)", got[i]);
    for (int i = 0; i < N + TE_LIVE; i++)
        free(got[i]);
}

Test(heap, fork_with_slab_extend_half_done)
{
    free(malloc(64));
    fork_while_stopped(torn_extend, NULL, check_torn_extend, NULL);
}

/* ----------------------------------------------------------------- decay */

static size_t resident_pages(const void *p, size_t len)
{
    unsigned char vec[64];
    cr_assert_leq(len / GS_PAGE, sizeof vec);
    cr_assert_eq((uintptr_t)p % GS_PAGE, 0, "medium object %p not page-aligned", p);
    cr_assert_eq(mincore((void *)p, len, vec), 0);
    size_t n = 0;
    for (size_t i = 0; i < (len + GS_PAGE - 1) / GS_PAGE; i++)
        n += vec[i] & 1;
    return n;
}

/* Allocates n medium objects of size bytes, each filled with its index
   + 1; live[i] is set for the first object of each slab (the one a test
   keeps, so that no slab empties). */
static void medium_objects(char **p, bool *live, int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        cr_assert_not_null(p[i] = malloc(size));
        memset(p[i], i + 1, size);
    }
    for (int i = 0; i < n; i++) {
        live[i] = true;
        for (int j = 0; j < i; j++)
            live[i] &= gsi_slab_of(p[j]) != gsi_slab_of(p[i]);
    }
}

/* Live and deferred objects keep their pages and contents (each filled
   with its index + 1); free ones have all their pages if free_kept, else
   none. */
static void check_medium_objects(char **p, const bool *live, const bool *deferred, int n,
                                 size_t size, bool free_kept)
{
    size_t obj = gsi_slab_of(p[0])->obj_size;
    for (int i = 0; i < n; i++) {
        if (live[i] || deferred[i]) {
            cr_assert_eq(resident_pages(p[i], obj), obj / GS_PAGE, "object %d lost pages", i);
            for (size_t k = 0; k < size; k += 997)
                cr_assert_eq(p[i][k], (char)(i + 1), "object %d changed at %zu", i, k);
        } else {
            cr_assert_eq(resident_pages(p[i], obj), free_kept ? obj / GS_PAGE : 0,
                         "free object %d: pages %s", i, free_kept ? "lost" : "kept");
        }
    }
}

/* After pages were given back. */
static void check_given_back(char **p, const bool *live, const bool *deferred, int n,
                             size_t size)
{
    check_medium_objects(p, live, deferred, n, size, false);
}

/* Blocks handed out again after their pages went back are usable: checks
   the n blocks of q, each filled with its index + 7, and frees them. */
static void check_reused_and_free(char **q, int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        cr_assert_eq(q[i][0], (char)(i + 7));
        cr_assert_eq(q[i][size - 1], (char)(i + 7));
        free(q[i]);
    }
}

/* decay.c: a medium object found free at two decay passes in a row gives
   its pages back; one pass is not enough; live objects and objects waiting
   for a grace period (a reader holds it) keep theirs and their contents;
   a decayed object is handed out again and usable. Every slab keeps one
   live object, so no slab empties (an empty slab may stay committed). */
Test(heap, idle_medium_objects_decay)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 1);
    enum { N = 64, SIZE = 40000 };
    static char *p[N];
    static bool live[N], deferred[N];
    medium_objects(p, live, N, SIZE);
    size_t obj = gsi_slab_of(p[0])->obj_size;
    int nfree = 0, ndefer = 0;
    struct gs_heap *h = gsi_tls_mine;
    unsigned cls = gsi_size_class(SIZE);
    cr_assert_geq(cls, GS_FIRST_MEDIUM_CLASS);
    struct gs_stats st0, st1, st2;
    gst_sleep_ms(5);
    gsi_heap_decay(h, cls); /* a pass with all of them allocated */
    gs_stats_get(&st0);
    gs_rcu_read_lock(); /* no grace period ends: deferred objects stay pending */
    for (int i = 0; i < N; i++) {
        if (live[i])
            continue;
        if (i % 5 == 1) {
            gs_free_rcu(p[i]);
            deferred[i] = true;
            ndefer++;
        } else {
            free(p[i]);
            nfree++;
        }
    }
    cr_assert_gt(nfree, 20);
    cr_assert_gt(ndefer, 5);
    gst_sleep_ms(5);
    gsi_heap_decay(h, cls);
    for (int i = 0; i < N; i++)
        if (!live[i] && !deferred[i])
            cr_assert_eq(resident_pages(p[i], obj), obj / GS_PAGE,
                         "object %d decayed after one pass", i);
    gst_sleep_ms(5);
    gsi_heap_decay(h, cls);
    check_given_back(p, live, deferred, N, SIZE);
    /* ...and no longer count as committed: the freed objects and the
       slabs' never-used free ones (no slab emptied, nothing mapped: the
       decayed pages are the whole difference). */
    gs_stats_get(&st1);
    cr_assert_eq(st1.mapped_bytes, st0.mapped_bytes);
    size_t fell = st0.committed_bytes - st1.committed_bytes, capacity = 0;
    for (int i = 0; i < N; i++)
        if (live[i])
            capacity += gsi_slab_of(p[i])->capacity;
    cr_assert(fell % obj == 0 && fell >= (size_t)nfree * obj &&
                  fell <= (capacity - (size_t)(N - nfree)) * obj,
              "committed fell by %zu bytes; %d objects of %zu freed, %zu in their slabs",
              fell, nfree, obj, capacity);
    gs_rcu_read_unlock();
    /* Decayed objects come back as usable memory, and count again. */
    static char *q[N];
    for (int i = 0; i < nfree; i++) {
        cr_assert_not_null(q[i] = malloc(SIZE));
        memset(q[i], i + 7, SIZE);
    }
    gs_stats_get(&st2);
    cr_assert_eq(st2.mapped_bytes, st0.mapped_bytes);
    cr_assert_eq(st2.committed_bytes - st1.committed_bytes, (size_t)nfree * obj,
                 "committed rose by %zu bytes for %d decayed objects of %zu handed out",
                 st2.committed_bytes - st1.committed_bytes, nfree, obj);
    check_reused_and_free(q, nfree, SIZE);
    for (int i = 0; i < N; i++)
        if (live[i])
            free(p[i]);
    gs_reclaim(SIZE_MAX);
}

/* Periods of 100 ms and more are timed on the coarse clock: passes still
   come one period apart (not before: a stamp of the fine clock, from a
   1 ms period just before, is not read as long ago), and two of them give
   the idle objects back. */
Test(heap, decay_with_long_period_uses_the_coarse_clock)
{
    enum { N = 32, SIZE = 40000, PERIOD_MS = 150 };
    static char *p[N];
    static bool live[N], deferred[N];
    struct gs_heap *h = gsi_tls_mine;
    medium_objects(p, live, N, SIZE);
    size_t obj = gsi_slab_of(p[0])->obj_size;
    unsigned cls = gsi_size_class(SIZE);
    gsi_option_set(GSI_OPT_DECAY_MS, 1);
    gst_sleep_ms(5);
    gsi_heap_decay(h, cls); /* a pass on the fine clock: all allocated */
    gsi_option_set(GSI_OPT_DECAY_MS, PERIOD_MS);
    for (int i = 0; i < N; i++)
        if (!live[i])
            free(p[i]);
    uint32_t pass = h->decay_pass;
    gsi_heap_decay(h, cls);
    cr_assert_eq(h->decay_pass, pass, "a pass before the period was over");
    gst_sleep_ms(PERIOD_MS + 30);
    gsi_heap_decay(h, cls);
    cr_assert_eq(h->decay_pass, pass + 1, "no pass one period later");
    gsi_heap_decay(h, cls);
    cr_assert_eq(h->decay_pass, pass + 1, "a second pass at once");
    for (int i = 0; i < N; i++)
        if (!live[i])
            cr_assert_eq(resident_pages(p[i], obj), obj / GS_PAGE,
                         "object %d decayed after one pass", i);
    gst_sleep_ms(PERIOD_MS + 30);
    gsi_heap_decay(h, cls);
    check_given_back(p, live, deferred, N, SIZE);
    for (int i = 0; i < N; i++)
        if (live[i])
            free(p[i]);
}

/* A free medium object whose pages cannot be given back (mlock: madvise
   fails with EINVAL) keeps them, is not counted as given back, and is
   tried again by the next trim once unlocked. */
Test(heap, locked_medium_objects_stay_committed)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 3600 * 1000); /* no decay pass meanwhile */
    enum { N = 16, SIZE = 70000 };
    static char *p[N];
    static bool live[N];
    medium_objects(p, live, N, SIZE);
    size_t obj = gsi_slab_of(p[0])->obj_size;
    int victim = -1;
    for (int i = 0; i < N && victim < 0; i++)
        if (!live[i])
            victim = i;
    cr_assert_geq(victim, 0);
    malloc_trim(0); /* whatever the earlier tests left */
    if (mlock(p[victim], obj) != 0)
        cr_skip_test("mlock: %s (no CAP_IPC_LOCK and a small RLIMIT_MEMLOCK)", strerror(errno));
    free(p[victim]);
    struct gs_stats st0, st1, st2;
    gs_stats_get(&st0);
    malloc_trim(0);
    gs_stats_get(&st1);
    cr_assert_eq(resident_pages(p[victim], obj), obj / GS_PAGE, "a locked object lost its pages");
    cr_assert_eq(st1.committed_bytes, st0.committed_bytes,
                 "committed fell by %zu bytes for a locked object",
                 st0.committed_bytes - st1.committed_bytes);
    cr_assert_eq(munlock(p[victim], obj), 0);
    malloc_trim(0);
    gs_stats_get(&st2);
    cr_assert_eq(resident_pages(p[victim], obj), 0, "the unlocked object kept its pages");
    cr_assert_eq(st1.committed_bytes - st2.committed_bytes, obj);
    for (int i = 0; i < N; i++)
        if (i != victim)
            free(p[i]);
}

/* A thread that only frees still decays its medium objects: a free that
   empties one of its slabs runs the pass (rate-limited as from malloc).
   Objects freed early, then slabs emptied a few milliseconds apart with no
   allocation at all, until two passes have run: the early ones give their
   pages back, the live ones keep pages and contents. (A free that adopts
   a released full slab is not the free that empties it, so not every
   emptying runs a pass; without the hook none does.) */
Test(heap, decay_runs_when_frees_empty_slabs)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 1);
    enum { N = 256, SIZE = 40000, EMPTIED = 6 }; /* 14 objects a slab */
    static char *p[N];
    static bool live[N], idle[N];
    medium_objects(p, live, N, SIZE);
    size_t obj = gsi_slab_of(p[0])->obj_size;
    /* The slabs of the first objects are emptied later, one at a time. */
    static struct gs_slab *emptied[EMPTIED];
    int nslabs = 0;
    for (int i = 0; i < N && nslabs < EMPTIED; i++)
        if (live[i])
            emptied[nslabs++] = gsi_slab_of(p[i]);
    cr_assert_eq(nslabs, EMPTIED);
    int nidle = 0;
    for (int i = 0; i < N; i++) {
        bool later = false;
        for (int k = 0; k < EMPTIED; k++)
            later |= gsi_slab_of(p[i]) == emptied[k];
        if (!live[i] && !later) {
            free(p[i]);
            idle[i] = true;
            nidle++;
        }
    }
    cr_assert_gt(nidle, 20);
    struct gs_heap *h = gsi_tls_mine;
    uint32_t pass0 = h->decay_pass;
    for (int k = 0; k < EMPTIED && h->decay_pass < pass0 + 2; k++) {
        gst_sleep_ms(5);
        for (int i = 0; i < N; i++)
            if (!idle[i] && p[i] && gsi_slab_of(p[i]) == emptied[k]) {
                free(p[i]);
                p[i] = NULL;
            }
    }
    cr_assert_geq(h->decay_pass, pass0 + 2, "frees that emptied slabs ran %u decay passes",
                  h->decay_pass - pass0);
    for (int i = 0; i < N; i++) {
        if (idle[i])
            cr_assert_eq(resident_pages(p[i], obj), 0, "idle object %d kept its pages", i);
        else if (p[i])
            for (size_t k = 0; k < SIZE; k += 997)
                cr_assert_eq(p[i][k], (char)(i + 1), "live object %d changed at %zu", i, k);
    }
    for (int i = 0; i < N; i++)
        if (p[i] && !idle[i])
            free(p[i]);
    gs_reclaim(SIZE_MAX);
}

/* malloc_trim gives back the pages of the calling thread's free medium
   objects at once, idle or not (glibc's trim gives back free pages inside
   its heaps); live objects and objects waiting for a grace period keep
   theirs and their contents; a second trim finds nothing more. Every slab
   keeps one live object, so no slab empties. */
Test(heap, malloc_trim_gives_back_free_medium_objects)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 3600 * 1000); /* no decay pass meanwhile */
    enum { N = 48, SIZE = 70000 };
    static char *p[N];
    static bool live[N], deferred[N];
    medium_objects(p, live, N, SIZE);
    size_t obj = gsi_slab_of(p[0])->obj_size;
    malloc_trim(0); /* whatever the earlier tests left */
    gs_rcu_read_lock(); /* deferred objects stay pending */
    int nfree = 0;
    for (int i = 0; i < N; i++) {
        if (live[i])
            continue;
        deferred[i] = i % 4 == 1;
        if (deferred[i])
            gs_free_rcu(p[i]);
        else
            free(p[i]);
        nfree += !deferred[i];
    }
    cr_assert_gt(nfree, 10);
    for (int i = 0; i < N; i++)
        cr_assert_eq(resident_pages(p[i], obj), obj / GS_PAGE, "object %d lost pages at free", i);
    struct gs_stats st0, st1;
    gs_stats_get(&st0);
    cr_assert_eq(malloc_trim(0), 1, "nothing given back");
    check_given_back(p, live, deferred, N, SIZE);
    gs_stats_get(&st1);
    cr_assert_geq(st0.committed_bytes - st1.committed_bytes, (size_t)nfree * obj,
                  "committed fell by %zu bytes; %d free objects of %zu trimmed",
                  st0.committed_bytes - st1.committed_bytes, nfree, obj);
    cr_assert_eq(malloc_trim(0), 0, "a second trim found memory to give back");
    gs_rcu_read_unlock();
    for (int i = 0; i < N; i++)
        if (live[i])
            free(p[i]);
    gs_reclaim(SIZE_MAX);
}

/* An exiting thread's medium slabs with free objects go on the orphan
   lists, where nothing decays: past the orphans' budget (a quarter of
   GRACESLAB_EMPTY_CACHE_MB) their free objects give their pages back as
   the thread exits; within it they keep them for the next adopter (a
   program that starts threads one after another, each leaving some of its
   blocks free, ran 12 times slower when every exit gave them back). The
   worker frees or defers all but one object of each slab, and no decay
   pass is due while it runs. Live and deferred objects (this thread
   reads, so no grace period ends) keep their pages and contents either
   way; freed ones come back usable. */
enum { XM_N = 64, XM_SIZE = 40000 };
static char *xm_p[XM_N];
static bool xm_live[XM_N], xm_deferred[XM_N];
static bool xm_defers = true; /* the worker defers every fifth object */

static void *xm_worker(void *arg)
{
    int *nfree = arg;
    for (int i = 0; i < XM_N; i++) {
        if (!(xm_p[i] = malloc(XM_SIZE)))
            return NULL;
        memset(xm_p[i], i + 1, XM_SIZE);
    }
    for (int i = 0; i < XM_N; i++) {
        xm_live[i] = true;
        for (int j = 0; j < i; j++)
            xm_live[i] &= gsi_slab_of(xm_p[j]) != gsi_slab_of(xm_p[i]);
    }
    for (int i = 0; i < XM_N; i++) {
        if (xm_live[i])
            continue;
        if (xm_defers && i % 5 == 1) {
            gs_free_rcu(xm_p[i]);
            xm_deferred[i] = true;
        } else {
            free(xm_p[i]);
            (*nfree)++;
        }
    }
    return arg;
}

/* Runs the worker under a read lock and checks the objects (free ones:
   resident if free_kept, else not); returns how many it freed. */
static int xm_run_worker(bool free_kept)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    cr_assert_geq(gsi_size_class(XM_SIZE), GS_FIRST_MEDIUM_CLASS);
    int nfree = 0;
    pthread_t t;
    gs_rcu_read_lock();
    cr_assert_eq(pthread_create(&t, NULL, xm_worker, &nfree), 0);
    void *ret;
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_eq(ret, &nfree, "the worker ran out of memory");
    cr_assert_gt(nfree, 20);
    check_medium_objects(xm_p, xm_live, xm_deferred, XM_N, XM_SIZE, free_kept);
    gs_rcu_read_unlock();
    return nfree;
}

/* Allocates the freed objects' worth again (from the orphans), checks the
   blocks are usable, then frees everything. orphaned_after: the orphans'
   count once the blocks are allocated, before anything is freed. */
static void xm_reuse_and_free(int nfree, size_t *orphaned_after)
{
    static char *q[XM_N];
    for (int i = 0; i < nfree; i++) {
        cr_assert_not_null(q[i] = malloc(XM_SIZE));
        memset(q[i], i + 7, XM_SIZE);
    }
    *orphaned_after = atomic_load(&gsi_orphan_free_bytes);
    check_reused_and_free(q, nfree, XM_SIZE);
    for (int i = 0; i < XM_N; i++)
        if (xm_live[i])
            free(xm_p[i]);
    gs_reclaim(SIZE_MAX);
}

Test(heap, exiting_thread_gives_back_free_medium_objects_past_budget)
{
    gsi_option_set(GSI_OPT_EMPTY_CACHE_MB, 0); /* orphans keep nothing */
    int nfree = xm_run_worker(false);
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), 0);
    size_t after;
    xm_reuse_and_free(nfree, &after);
    cr_assert_eq(after, 0);
}

Test(heap, exiting_thread_keeps_free_medium_objects_within_budget)
{
    /* Nothing deferred: the sweeps that reclaim deferred objects into the
       orphans would change the count at times of their own. */
    xm_defers = false;
    int nfree = xm_run_worker(true);
    size_t obj = gsi_slab_of(xm_p[0])->obj_size;
    cr_assert_leq((size_t)nfree * obj, ((size_t)gsi_option(GSI_OPT_EMPTY_CACHE_MB) << 20) / 4);
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), (size_t)nfree * obj);
    size_t after;
    xm_reuse_and_free(nfree, &after);
    /* Orphans adopted again for those blocks are no longer counted (the
       refill also extends an adopted slab into its never-used objects, so
       some orphans may wait on). */
    cr_assert_lt(after, (size_t)nfree * obj);
}

/* malloc_trim gives back the free pages orphans keep within their budget
   (orphan_evict until none keeps any): nothing else would while no thread
   gives up a slab. */
Test(heap, malloc_trim_gives_back_orphans_pages)
{
    xm_defers = false;
    xm_run_worker(true);
    cr_assert_gt(atomic_load(&gsi_orphan_free_bytes), 0);
    cr_assert_eq(malloc_trim(0), 1);
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), 0);
    size_t obj = gsi_slab_of(xm_p[0])->obj_size;
    for (int i = 0; i < XM_N; i++)
        if (!xm_live[i])
            cr_assert_eq(resident_pages(xm_p[i], obj), 0, "free object %d kept its pages", i);
    for (int i = 0; i < XM_N; i++)
        if (xm_live[i])
            free(xm_p[i]);
}

/* Orphans that nobody adopts do not hold the orphans' budget for good: a
   thread that leaves more free objects of one class than the budget takes
   (a class nobody allocates again), then a thread that leaves a few of
   another class. The second's are kept committed for an adopter, and the
   first's oldest orphans give way (with the first-come rule, every later
   exit gave its pages back, and the next thread faulted them in again:
   6 to 11 times slower per thread in a helper's program). */
struct ev_worker {
    size_t size;
    int n, nfree, nslabs;
    bool trim; /* malloc_trim before exiting: the free objects' pages go back */
    int keep;  /* objects kept live per slab (its first ones); 0: one */
    char *p[1024];
    bool live[1024];
};

static void *ev_run(void *arg)
{
    struct ev_worker *w = arg;
    for (int i = 0; i < w->n; i++) {
        if (!(w->p[i] = malloc(w->size)))
            return NULL;
        memset(w->p[i], i + 1, w->size);
    }
    for (int i = 0; i < w->n; i++) {
        int before = 0;
        for (int j = 0; j < i; j++)
            before += gsi_slab_of(w->p[j]) == gsi_slab_of(w->p[i]);
        w->live[i] = before < (w->keep ? w->keep : 1);
        if (!w->live[i]) {
            free(w->p[i]);
            w->nfree++;
        } else {
            w->nslabs++;
        }
    }
    if (w->trim)
        malloc_trim(0);
    return arg;
}

static void ev_thread(struct ev_worker *w)
{
    pthread_t t;
    void *ret;
    cr_assert_eq(pthread_create(&t, NULL, ev_run, w), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_eq(ret, w, "the worker ran out of memory");
}

Test(heap, orphans_nobody_adopts_give_way_to_new_ones)
{
    gsi_option_set(GSI_OPT_EMPTY_CACHE_MB, 4); /* orphans keep 1 MiB */
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    size_t budget = (size_t)1 << 20;
    /* First orphans of the class that keep nothing: more than 64 (a walk
       from the oldest orphan bounded at 64 found no committed one behind
       them, and the late thread's pages went back). */
    /* a class's size, 10 a slab */
    static struct ev_worker bare = {.size = 98304, .n = 700, .trim = true};
    static struct ev_worker hoard = {.size = 98304, .n = 48};
    static struct ev_worker late = {.size = 40000, .n = 12};
    ev_thread(&bare);
    cr_assert_gt(bare.nslabs, 64);
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), 0);
    ev_thread(&hoard);
    size_t hoarded = atomic_load(&gsi_orphan_free_bytes);
    size_t hoard_obj = gsi_slab_of(hoard.p[0])->obj_size;
    cr_assert_gt((size_t)hoard.nfree * hoard_obj, budget, "the first thread must fill the budget");
    cr_assert_leq(hoarded, budget);
    ev_thread(&late);
    size_t obj = gsi_slab_of(late.p[0])->obj_size, late_bytes = (size_t)late.nfree * obj;
    cr_assert_gt(hoarded + late_bytes, budget, "the second thread's objects must not fit as is");
    cr_assert_geq(atomic_load(&gsi_orphan_free_bytes), late_bytes);
    cr_assert_leq(atomic_load(&gsi_orphan_free_bytes), budget);
    for (int i = 0; i < late.n; i++)
        if (!late.live[i])
            cr_assert_eq(resident_pages(late.p[i], obj), obj / GS_PAGE,
                         "the last thread's free object %d lost its pages", i);
    /* The first thread's live objects kept theirs and their contents. */
    for (int i = 0; i < hoard.n; i++)
        if (hoard.live[i]) {
            cr_assert_eq(resident_pages(hoard.p[i], hoard_obj), hoard_obj / GS_PAGE);
            for (size_t k = 0; k < hoard.size; k += 997)
                cr_assert_eq(hoard.p[i][k], (char)(i + 1), "object %d changed at %zu", i, k);
        }
}

/* Slabs a live heap sheds (GS_TAKEOVER_PARTIAL) keep their free objects'
   pages whatever the orphans' budget (here none): an allocating heap
   adopts them soon, and a consumer of medium blocks that gave back each
   shed slab's pages made the producer fault them in again (3 to 5 times
   slower in a review's pipeline). */
struct shed {
    char **blocks;
    const bool *keep;
    int n;
    struct handshake hs;
};

static void *free_unkept(void *arg)
{
    struct shed *c = arg;
    for (int i = 0; i < c->n; i++)
        if (!c->keep[i])
            free(c->blocks[i]);
    handshake_pause(&c->hs); /* alive while the main thread looks */
    return NULL;
}

Test(heap, shed_slabs_keep_their_pages)
{
    gsi_option_set(GSI_OPT_EMPTY_CACHE_MB, 0); /* the orphans keep nothing */
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    enum { N = 64, SIZE = 98304 }; /* a class's size: every page written */
    static char *p[N];
    static bool live[N];
    medium_objects(p, live, N, SIZE);
    struct shed c = {.blocks = p, .keep = live, .n = N};
    handshake_start(&c.hs, free_unkept, &c);
    int shed = 0;
    for (int i = 0; i < N; i++)
        shed += live[i] && gsi_slab_of(p[i])->orphaned;
    check_medium_objects(p, live, live, N, SIZE, true);
    handshake_finish(&c.hs);
    cr_assert_gt(shed, 0, "the consumer shed no slab");
    for (int i = 0; i < N; i++)
        if (live[i])
            free(p[i]);
}

/* The orphans' count is what the listed orphans keep: a slab gs_free_rcu
   adopts keeps its orphan entry as a hint (it adopts without the list
   lock); when its heap gives it up again, and when a sweep settles it
   with the deferred object reclaimed, the entry and its count must be
   renewed (they kept the old figure: a review found 132 MB committed on
   orphans with 2 MB counted through such entries). */
static size_t orphans_audited;
static void audit_orphan(struct gs_slab *s, void *arg)
{
    (void)arg;
    if (s->kind == GS_SLAB_SMALL && s->orphaned)
        orphans_audited +=
            (size_t)__builtin_popcount(gsi_slab_committed_free(s)) * s->obj_size;
}

static size_t orphans_committed(void)
{
    orphans_audited = 0;
    gsi_segments_foreach(audit_orphan, NULL);
    return orphans_audited;
}

/* Two live objects a slab, so that the slab does not empty when one of
   them is deferred and reclaimed. */
static struct ev_worker stale_first = {.size = 40960, .n = 24, .keep = 2}; /* a class's size */

static void *defer_into_orphan(void *arg)
{
    (void)arg;
    /* An active slab of the class (an orphan adopted by the refill), then
       a deferral into another orphan, which this heap adopts; then exit. */
    void *mine = malloc(40960);
    int target = -1;
    for (int i = 0; i < stale_first.n && target < 0; i++)
        if (stale_first.live[i] && gsi_slab_of(stale_first.p[i])->orphaned &&
            gsi_slab_of(stale_first.p[i]) != gsi_slab_of(mine))
            target = i;
    if (target < 0)
        return NULL;
    struct gs_slab *s = gsi_slab_of(stale_first.p[target]);
    gs_free_rcu(stale_first.p[target]);
    stale_first.p[target] = NULL;
    bool stale = s->orphaned && GS_X_OWNER(atomic_load(&s->xstate)) == gsi_tls_mine->id;
    free(mine);
    return stale ? arg : NULL;
}

Test(heap, orphan_count_follows_stale_entries)
{
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    ev_thread(&stale_first);
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), orphans_committed());
    cr_assert_gt(atomic_load(&gsi_orphan_free_bytes), 0);
    pthread_t t;
    void *ret;
    cr_assert_eq(pthread_create(&t, NULL, defer_into_orphan, &stale_first), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_not_null(ret, "no orphan adopted by gs_free_rcu to test with");
    gs_synchronize_rcu();
    gs_reclaim(SIZE_MAX); /* the deferred object back in its slab */
    cr_assert_eq(atomic_load(&gsi_orphan_free_bytes), orphans_committed(),
                 "%zu bytes counted, %zu committed on the orphans",
                 atomic_load(&gsi_orphan_free_bytes), orphans_committed());
    for (int i = 0; i < stale_first.n; i++)
        if (stale_first.live[i])
            free(stale_first.p[i]);
}

/* The empty-slab budget counts the slabs' committed bytes, not their span:
   a thread that frees 3 in 4 of its medium blocks at random and exits
   leaves orphans whose free pages go back (above), and the slots of the
   slabs it emptied stay committed only up to half of what is still
   committed (GRACESLAB_EMPTY_CACHE_MB set to 0 here). With the span
   counted, the slots kept committed were about as many bytes as the blocks
   left live. */
enum { EB_N = 600 };
static char *eb_p[EB_N];
static size_t eb_live_bytes;

static void *eb_worker(void *arg)
{
    uint64_t rng = 12345;
    for (int i = 0; i < EB_N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 100000 + (size_t)(rng >> 33) % 100000;
        if (!(eb_p[i] = malloc(n)))
            return NULL;
        memset(eb_p[i], 1, n);
    }
    for (int i = 0; i < EB_N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        if ((rng >> 33) % 4) {
            free(eb_p[i]);
            eb_p[i] = NULL;
        } else {
            eb_live_bytes += gs_usable_size(eb_p[i]);
        }
    }
    return arg;
}

Test(heap, empty_slot_budget_counts_committed_bytes)
{
    gsi_option_set(GSI_OPT_EMPTY_CACHE_MB, 0);
    gsi_option_set(GSI_OPT_DECAY_MS, 3600000);
    gsi_option_set(GSI_OPT_PURGE_DELAY_MS, 3600000);
    pthread_t t;
    void *ret;
    cr_assert_eq(pthread_create(&t, NULL, eb_worker, &eb_live_bytes), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_eq(ret, &eb_live_bytes, "the worker ran out of memory");
    size_t dirty = gsi_segments_dirty_bytes();
    cr_assert_leq(dirty, eb_live_bytes * 3 / 4,
                  "%zu bytes of empty slots committed for %zu live", dirty, eb_live_bytes);
    for (int i = 0; i < EB_N; i++)
        free(eb_p[i]);
}

/* ---- full slabs kept by a heap that adopts its own back (heap.c) ---- */

#define KF_SIZE 64
#define KF_SLABS 80

struct kf {
    void **p;     /* every block allocated, NULL once freed */
    size_t n;
    unsigned cls;
};

/* Fills KF_SLABS slabs of KF_SIZE, then frees one block in each of 70
   of them (not the active one): each was used up and released, so each
   free adopts back a slab of this heap, and after GS_KEEP_FULL_AFTER (64)
   of them the heap keeps its used-up slabs. Then allocates until one such
   slab is used up again: it must be on the full list, still owned. */
static struct gs_slab *kf_setup(struct kf *k)
{
    k->cls = gsi_size_class(KF_SIZE);
    k->n = (size_t)KF_SLABS * gsi_classes[k->cls].capacity;
    k->p = gst_raw_array(k->n + 4096);
    cr_assert_not_null(k->p);
    for (size_t i = 0; i < k->n; i++)
        cr_assert_not_null(k->p[i] = malloc(KF_SIZE));
    struct gs_heap *h = gsi_tls_mine;
    cr_assert(!h->keep_full);
    struct gs_slab *last = NULL;
    unsigned adopted = 0;
    for (size_t i = 0; i < k->n && adopted < 70; i++) {
        struct gs_slab *s = gsi_slab_of(k->p[i]);
        if (s == last || s == h->active[k->cls])
            continue;
        last = s;
        cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), 0, "a used-up slab was not released");
        free(k->p[i]);
        k->p[i] = NULL;
        cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id, "the free did not adopt it");
        adopted++;
    }
    cr_assert(h->keep_full, "no keep_full after %u adoptions of its own slabs", adopted);
    for (size_t i = k->n; i < k->n + 4096 && !h->full[k->cls].first; i++)
        cr_assert_not_null(k->p[i] = malloc(KF_SIZE));
    k->n += 4096;
    struct gs_slab *s = h->full[k->cls].first;
    cr_assert_not_null(s, "no slab on the full list");
    cr_assert_eq(s->where, GS_IN_FULL);
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id, "a full slab was released");
    cr_assert_eq(atomic_load(&s->owner_key), h->key, "its frees must take the fast path");
    return s;
}

/* The index of a live block of k's in slab s (there must be one). */
static size_t kf_block_in(const struct kf *k, const struct gs_slab *s)
{
    size_t i = 0;
    while (i < k->n && (!k->p[i] || gsi_slab_of(k->p[i]) != s))
        i++;
    cr_assert_lt(i, k->n, "no live block in the full slab");
    return i;
}

static void kf_free_all(struct kf *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->p[i]);
    munmap(k->p, k->n * sizeof(void *));
}

/* The owner's free into a full slab is an ordinary local free (the slab
   stays on the full list, owned), and a later refill finds the room it
   made: the block is handed out again. Freeing everything leaves no empty
   slab on a full list. */
Test(heap, keeps_full_slabs_when_it_adopts_its_own_back)
{
    struct kf k;
    struct gs_slab *s = kf_setup(&k);
    struct gs_heap *h = gsi_tls_mine;
    size_t i = kf_block_in(&k, s);
    uint64_t used = s->used;
    void *freed = k.p[i];
    free(freed);
    k.p[i] = NULL;
    cr_assert_eq(s->where, GS_IN_FULL);
    cr_assert_eq(s->used, used - 1);
    cr_assert_eq(s->free_ptr, (char *)freed, "not on the slab's free list");
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id);
    /* Every full slab gets its turn: the block comes back within as many
       allocations as there are objects in all the slabs made so far. */
    enum { MORE = 200000 };
    void **more = gst_raw_array(MORE);
    size_t m = 0;
    bool again = false;
    while (m < MORE && !again) {
        cr_assert_not_null(more[m] = malloc(KF_SIZE));
        again = more[m++] == freed;
    }
    cr_assert(again, "the freed block was not handed out again in %zu allocations", m);
    for (size_t j = 0; j < m; j++)
        free(more[j]);
    kf_free_all(&k);
    /* What stays on a full list holds someone's blocks (the test runner's):
       an emptied slab never stays there. */
    size_t left = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        for (struct gs_slab *f = h->full[c].first; f; f = f->next, left++)
            cr_assert_gt(f->used, 0, "an empty slab on the full list of class %u", c);
    cr_assert_leq(left, 2, "%zu slabs still on full lists after every free", left);
}

struct kf_remote {
    void *block;
};

static void *kf_free_elsewhere(void *arg)
{
    free(((struct kf_remote *)arg)->block); /* remote: pushed at thread exit at the latest */
    return NULL;
}

/* Allocates blocks of `size` until refill has seen another thread's free
   into a full slab and ended keep_full; returns them (count in *m), for
   the caller to free with free_more(). */
#define KF_MORE 200000

static void **allocate_until_keep_full_ends(size_t size, size_t *m)
{
    struct gs_heap *h = gsi_tls_mine;
    void **more = gst_raw_array(KF_MORE);
    cr_assert_not_null(more);
    *m = 0;
    while (*m < KF_MORE && h->keep_full)
        cr_assert_not_null(more[(*m)++] = malloc(size));
    cr_assert(!h->keep_full, "still keeping full slabs after %zu allocations", *m);
    return more;
}

static void free_more(void **more, size_t m)
{
    for (size_t j = 0; j < m; j++)
        free(more[j]);
    munmap(more, KF_MORE * sizeof(void *));
}

/* After the thread that allocated them exited: the slab of every block
   still live is ownerless. */
static void assert_slabs_ownerless(void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            cr_assert_eq(GS_X_OWNER(atomic_load(&gsi_slab_of(p[i])->xstate)), 0,
                         "block %zu: its slab is still owned after its thread exited", i);
}

/* Another thread's free into a full slab waits on its remote chain; the
   owner's refills look at the full slabs, find it, and the heap goes back
   to releasing its used-up slabs (none left on the full lists). */
Test(heap, remote_free_into_full_slab_ends_keep_full)
{
    struct kf k;
    struct gs_slab *s = kf_setup(&k);
    struct gs_heap *h = gsi_tls_mine;
    size_t i = kf_block_in(&k, s);
    struct kf_remote r = {k.p[i]};
    k.p[i] = NULL;
    run_thread(kf_free_elsewhere, &r);
    cr_assert_eq(GS_X_COUNT(atomic_load(&s->xstate)), 1, "the remote free is not on the chain");
    /* Allocate until refill has looked at every full slab. */
    size_t m;
    void **more = allocate_until_keep_full_ends(KF_SIZE, &m);
    size_t full = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        full += h->full[c].count;
    cr_assert_eq(full, 0);
    free_more(more, m);
    kf_free_all(&k);
}

static void *kf_thread_exits_with_full_slabs(void *arg)
{
    struct kf *k = arg;
    struct gs_slab *s = kf_setup(k);
    (void)s;
    return NULL; /* exits holding full slabs */
}

/* A thread that exits with slabs on its full list gives them up like the
   others: every slab of its blocks is ownerless afterwards, and another
   thread frees them all. */
Test(heap, thread_exit_releases_full_slabs)
{
    struct kf k;
    run_thread(kf_thread_exits_with_full_slabs, &k);
    assert_slabs_ownerless(k.p, k.n);
    kf_free_all(&k);
}

/* ---- medium slabs parked by a heap that keeps its full slabs ---- */

#define PK_SIZE 40000
#define PK_BLOCKS 64

struct pk {
    struct kf k;          /* keep_full entered with small blocks */
    void *p[PK_BLOCKS];   /* medium blocks */
    unsigned cls;
    uint64_t before;      /* blocks of the class the test runner holds */
};

/* Enters keep_full (kf_setup), then allocates medium blocks until one of
   their slabs is used up: it must be parked on the full list, owned, with
   its watch of 1 for `used`, and counted as wholly allocated. */
static struct gs_slab *pk_setup(struct pk *t)
{
    kf_setup(&t->k);
    struct gs_heap *h = gsi_tls_mine;
    t->cls = gsi_size_class(PK_SIZE);
    cr_assert_geq(t->cls, GS_FIRST_MEDIUM_CLASS);
    struct gs_stats st0, st1;
    gs_stats_get(&st0);
    t->before = st0.class_allocated[t->cls];
    int n = 0;
    while (n < PK_BLOCKS && !h->full[t->cls].first) {
        cr_assert_not_null(t->p[n] = malloc(PK_SIZE));
        memset(t->p[n], n, 64);
        n++;
    }
    for (int i = n; i < PK_BLOCKS; i++)
        t->p[i] = NULL;
    struct gs_slab *s = h->full[t->cls].first;
    cr_assert_not_null(s, "no medium slab on the full list after %d blocks", n);
    cr_assert_eq(s->where, GS_IN_PARKED);
    cr_assert_eq(s->used, 1, "the watch");
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id, "a used-up medium slab was released");
    cr_assert_eq(atomic_load(&s->owner_key), h->key, "its frees must take the fast path");
    gs_stats_get(&st1);
    cr_assert_eq(st1.class_allocated[t->cls] - st0.class_allocated[t->cls], (uint64_t)n,
                 "%d medium blocks allocated, the statistics count %lu", n,
                 (unsigned long)(st1.class_allocated[t->cls] - st0.class_allocated[t->cls]));
    return s;
}

static int pk_block_in(const struct pk *t, const struct gs_slab *s)
{
    int i = 0;
    while (i < PK_BLOCKS && (!t->p[i] || gsi_slab_of(t->p[i]) != s))
        i++;
    cr_assert_lt(i, PK_BLOCKS, "no live medium block in the parked slab");
    return i;
}

/* Frees everything and checks that the medium class is wholly free again
   (a wrong count would leave blocks counted, or trip an assertion). */
static void pk_free_all(struct pk *t)
{
    for (int i = 0; i < PK_BLOCKS; i++)
        free(t->p[i]);
    kf_free_all(&t->k);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_eq(st.class_allocated[t->cls], t->before,
                 "%lu medium blocks counted, %lu before the test's",
                 (unsigned long)st.class_allocated[t->cls], (unsigned long)t->before);
}

/* The owner's free into a parked slab unparks it at once (its count back
   to capacity - 1) onto the partial list, still owned, and the block is
   handed out again before any new slab is made. */
Test(heap, owner_free_unparks_medium_slab)
{
    struct pk t;
    struct gs_slab *s = pk_setup(&t);
    struct gs_heap *h = gsi_tls_mine;
    int i = pk_block_in(&t, s);
    void *freed = t.p[i];
    free(freed);
    t.p[i] = NULL;
    cr_assert_eq(s->where, GS_IN_PARTIAL);
    cr_assert_eq(s->used, s->capacity - 1);
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), h->id);
    /* The active slab's free blocks first, then the partial slab's. */
    void *more[17]; /* a medium slab holds at most 16 */
    size_t m = 0, limit = h->active[t.cls]->capacity + 1;
    cr_assert_leq(limit, 17);
    bool again = false;
    while (m < limit && !again) {
        cr_assert_not_null(more[m] = malloc(PK_SIZE));
        again = more[m++] == freed;
    }
    cr_assert(again, "the freed block was not handed out again in %zu allocations", m);
    cr_assert_eq(s->where, GS_IN_ACTIVE);
    for (size_t j = 0; j < m; j++)
        free(more[j]);
    pk_free_all(&t);
}

/* Two blocks of a parked slab deferred by its owner: the sweep that
   reclaims them counts from the true count (capacity), so the slab ends up
   partial with two free objects. */
Test(heap, reclaim_into_parked_slab_counts_from_capacity)
{
    struct pk t;
    struct gs_slab *s = pk_setup(&t);
    for (int k = 0; k < 2; k++) {
        int i = pk_block_in(&t, s);
        gs_free_rcu(t.p[i]);
        t.p[i] = NULL;
    }
    cr_assert_eq(s->where, GS_IN_PARKED, "a deferral is no free: still parked");
    gs_reclaim(SIZE_MAX);
    cr_assert_eq(s->used, s->capacity - 2);
    cr_assert_eq(s->where, GS_IN_PARTIAL);
    pk_free_all(&t);
}

/* Another thread's free into a parked slab goes to its remote chain; the
   owner's refills find it, end keep_full and count the slab right. */
Test(heap, remote_free_into_parked_slab)
{
    struct pk t;
    struct gs_slab *s = pk_setup(&t);
    int i = pk_block_in(&t, s);
    struct kf_remote r = {t.p[i]};
    t.p[i] = NULL;
    run_thread(kf_free_elsewhere, &r);
    cr_assert_eq(GS_X_COUNT(atomic_load(&s->xstate)), 1, "the remote free is not on the chain");
    size_t m;
    void **more = allocate_until_keep_full_ends(PK_SIZE, &m);
    cr_assert_neq(s->where, GS_IN_PARKED);
    free_more(more, m);
    pk_free_all(&t);
}

static void *pk_thread_exits_with_parked_slab(void *arg)
{
    pk_setup(arg);
    return NULL;
}

/* A thread that exits with a parked slab gives it up with its true count:
   ownerless, and another thread's frees empty it. */
Test(heap, thread_exit_releases_parked_slab)
{
    struct pk t;
    run_thread(pk_thread_exits_with_parked_slab, &t);
    assert_slabs_ownerless(t.p, PK_BLOCKS);
    pk_free_all(&t);
}

/* The watch's two values: 1 stands for the capacity; 0 (a free made whose
   slow path has not run: a thread freeing into a dead thread's heap's slab
   abandons that heap first, which unparks the slab) for capacity - 1. */
Test(heap, unpark_counts_a_free_already_made)
{
    struct pk t;
    struct gs_slab *s = pk_setup(&t);
    s->used = 0; /* as the fast path leaves it before gsi_heap_free_emptied */
    gsi_heap_slab_unpark(s);
    cr_assert_eq(s->used, s->capacity - 1);
    cr_assert_eq(s->where, GS_IN_FULL);
    s->used = s->capacity; /* no free was made: put the true count back */
    pk_free_all(&t);
}

/* A sweep unparks a parked slab to reclaim into it; when the reclaim gets
   nothing (another sweep handed the chain to the remote chain meanwhile),
   the slab is parked again, and the owner's next free still unparks it. */
Test(heap, slab_unparked_for_an_empty_reclaim_is_parked_again)
{
    struct pk t;
    struct gs_slab *s = pk_setup(&t);
    struct gs_heap *h = gsi_tls_mine;
    gsi_heap_slab_unpark(s); /* as settle() does */
    cr_assert_eq(s->used, s->capacity);
    cr_assert_eq(gsi_pending_reclaim_local(s), 0);
    gsi_heap_slab_reclaimed(h, s);
    cr_assert_eq(s->where, GS_IN_PARKED);
    cr_assert_eq(s->used, 1);
    int i = pk_block_in(&t, s);
    free(t.p[i]);
    t.p[i] = NULL;
    cr_assert_eq(s->where, GS_IN_PARTIAL);
    cr_assert_eq(s->used, s->capacity - 1);
    pk_free_all(&t);
}

struct pk_fork {
    struct pk t;
    struct gs_slab *s;
    pthread_barrier_t ready, done;
};

static void *pk_hold(void *arg)
{
    struct pk_fork *f = arg;
    f->s = pk_setup(&f->t);
    pthread_barrier_wait(&f->ready);
    pthread_barrier_wait(&f->done); /* alive, holding the parked slab, across the fork */
    return NULL;
}

/* A fork child in which the thread that parked a slab is lost, with two
   frees of another thread on the slab's remote chain: the child repairs
   the slab (recount, then collect: with the watch as the count the
   collect tripped its `used >= n` assertion) and counts it right, so
   freeing the rest of its blocks leaves the class as the runner had it. */
Test(heap, fork_child_repairs_parked_slab_with_remote_frees)
{
    static struct pk_fork f;
    pthread_t th;
    cr_assert_eq(pthread_barrier_init(&f.ready, NULL, 2), 0);
    cr_assert_eq(pthread_barrier_init(&f.done, NULL, 2), 0);
    cr_assert_eq(pthread_create(&th, NULL, pk_hold, &f), 0);
    pthread_barrier_wait(&f.ready);
    for (int k = 0; k < 2; k++) {
        int i = pk_block_in(&f.t, f.s);
        free(f.t.p[i]); /* remote: batched, pushed by gs_stats_get below */
        f.t.p[i] = NULL;
    }
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_eq(GS_X_COUNT(atomic_load(&f.s->xstate)), 2, "the remote frees are not on the chain");
    cr_assert_eq(f.s->where, GS_IN_PARKED);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        for (int i = 0; i < PK_BLOCKS; i++)
            free(f.t.p[i]);
        gs_stats_get(&st);
        _exit(st.class_allocated[f.t.cls] == f.t.before ? 0 : 3);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the fork child died (signal %d)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "the child counted the medium blocks wrong");
    pthread_barrier_wait(&f.done);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&f.ready);
    pthread_barrier_destroy(&f.done);
    pk_free_all(&f.t);
}

/* ---- remote frees into slabs whose owner does not look at them --------- */

/* Slab metadata committed, in MiB, from the statistics. */
static size_t committed_mib(void)
{
    struct gs_stats st;
    gs_stats_get(&st);
    return st.committed_bytes >> 20;
}

/* Two threads each allocate half of a constant live set, then every
   block is freed by one of the two at random (half the frees are
   remote), round after round. A heap whose partial list never ran dry
   never looked at its older partial or full slabs, whose other-thread
   frees then waited on their chains for good: 12.8 MB live, 130 MB
   committed after 40 rounds (a stress helper's case, thirtieth
   session). Now each refill looks at one full slab and at the partial
   slab looked at longest ago. */
enum { SWAP_N = 50000, SWAP_SIZE = 256, SWAP_ROUNDS = 24 };
static void *swap_blocks[SWAP_N];
static unsigned char swap_who[SWAP_N];
static pthread_barrier_t swap_barrier;

static void *swap_thread(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    for (int r = 0; r < SWAP_ROUNDS; r++) {
        for (size_t i = id; i < SWAP_N; i += 2) {
            swap_blocks[i] = gs_malloc(SWAP_SIZE);
            if (!swap_blocks[i])
                abort();
            memset(swap_blocks[i], (int)id, SWAP_SIZE);
        }
        pthread_barrier_wait(&swap_barrier); /* all allocated */
        pthread_barrier_wait(&swap_barrier); /* who frees what is drawn */
        for (size_t i = 0; i < SWAP_N; i++)
            if (swap_who[i] == id)
                gs_free(swap_blocks[i]);
        pthread_barrier_wait(&swap_barrier); /* all freed */
        pthread_barrier_wait(&swap_barrier); /* measured */
    }
    return NULL;
}

Test(heap, threads_freeing_each_others_blocks_stay_bounded, .timeout = 120)
{
    pthread_t t[2];
    cr_assert_eq(pthread_barrier_init(&swap_barrier, NULL, 3), 0);
    for (uintptr_t i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, swap_thread, (void *)i), 0);
    uint64_t rng = 42;
    size_t most = 0, at = 0;
    for (int r = 0; r < SWAP_ROUNDS; r++) {
        pthread_barrier_wait(&swap_barrier);
        for (size_t i = 0; i < SWAP_N; i++)
            swap_who[i] = (unsigned char)(gst_rand(&rng) & 1);
        pthread_barrier_wait(&swap_barrier);
        pthread_barrier_wait(&swap_barrier);
        size_t mib = committed_mib();
        if (mib > most) {
            most = mib;
            at = (size_t)r;
        }
        pthread_barrier_wait(&swap_barrier);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&swap_barrier);
    cr_log_info("most committed: %zu MiB, after round %zu", most, at);
    /* Live set 12.2 MiB; the heaps' keeps of empty slabs (2 MiB each, and
       16 MiB shared) come on top. */
    cr_assert_leq(most, 48, "%zu MiB committed after round %zu for a live set of 12 MiB", most,
                  at);
}

/* One producer, two consumers that take its blocks at random and free
   them: each consumer takes over some of the producer's used-up slabs by
   freeing into them, and the other consumer's frees into those go to
   their chains. A consumer never allocates, so its refill never ran to
   collect them: 1.5 GB in 8 s for at most 1 MB live (the same helper's
   case). Now a takeover also looks at the partial slab of the class
   looked at longest ago. */
enum { PC_RING = 4096, PC_BLOCKS = 3000000, PC_SIZE = 256 };
struct pc_ring {
    _Alignas(64) _Atomic size_t head;
    _Alignas(64) _Atomic size_t tail;
    void *slot[PC_RING];
};
static struct pc_ring pc_rings[2];
static size_t pc_most; /* most MiB committed the producer saw */

static void *pc_producer(void *arg)
{
    (void)arg;
    uint64_t rng = 7;
    for (size_t n = 0; n < PC_BLOCKS; n++) {
        if (n % 65536 == 0) {
            size_t mib = committed_mib();
            if (mib > pc_most)
                pc_most = mib;
        }
        struct pc_ring *r = &pc_rings[gst_rand(&rng) & 1];
        size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        while (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= PC_RING)
            sched_yield();
        void *p = gs_malloc(PC_SIZE);
        if (!p)
            abort();
        memset(p, 0x5C, PC_SIZE);
        r->slot[tail % PC_RING] = p;
        atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    }
    for (int i = 0; i < 2; i++) { /* a NULL ends each consumer */
        struct pc_ring *r = &pc_rings[i];
        size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        while (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= PC_RING)
            sched_yield();
        r->slot[tail % PC_RING] = NULL;
        atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    }
    return NULL;
}

static void *pc_consumer(void *arg)
{
    struct pc_ring *r = arg;
    for (size_t head = 0;; head++) {
        while (atomic_load_explicit(&r->tail, memory_order_acquire) == head)
            sched_yield();
        void *p = r->slot[head % PC_RING];
        atomic_store_explicit(&r->head, head + 1, memory_order_release);
        if (!p)
            return NULL;
        gs_free(p);
    }
}

Test(heap, two_consumers_of_one_producer_stay_bounded, .timeout = 120)
{
    size_t before = committed_mib();
    pthread_t t[3];
    cr_assert_eq(pthread_create(&t[0], NULL, pc_consumer, &pc_rings[0]), 0);
    cr_assert_eq(pthread_create(&t[1], NULL, pc_consumer, &pc_rings[1]), 0);
    cr_assert_eq(pthread_create(&t[2], NULL, pc_producer, NULL), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    cr_log_info("most committed: %zu MiB (%zu before)", pc_most, before);
    /* At most 2 MiB in flight (two rings of 4096 blocks of 256 bytes). */
    cr_assert_leq(pc_most, before + 32, "%zu MiB committed during %d blocks (%zu before)",
                  pc_most, PC_BLOCKS, before);
}
