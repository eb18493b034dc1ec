/*
 * Slabs (alloc/slab.c): out-of-band link states, distinct non-overlapping
 * objects, the remote chain, release of an exhausted slab and adoption by
 * a free. Linked with the static archive.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"
#include "../common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

Test(slab, link_states_follow_the_object)
{
    char *p = malloc(48);
    char *keep = malloc(48); /* keeps the slab non-empty */
    struct gs_slab *s = gsi_slab_of(p);
    long idx = gsi_slab_index(s, p);
    cr_assert_geq(idx, 0);
    cr_assert_eq(gsi_link_load(s, (uint32_t)idx), GS_LINK_ALLOCATED);
    cr_assert_eq(gsi_link_load(s, s->capacity), GS_LINK_INVALID, "no sentinel after the last object");
    uint64_t used = s->used;
    free(p);
    uint16_t v = gsi_link_load(s, (uint32_t)idx);
    cr_assert_neq(v, GS_LINK_ALLOCATED);
    cr_assert_eq(v & (GS_LINK_REMOTE | GS_LINK_PENDING), 0, "local free marked remote/pending");
    cr_assert_eq(s->free_head, (uint32_t)idx, "local free list is not LIFO");
    cr_assert_eq(s->used, used - 1);
    char *q = malloc(48);
    cr_assert_eq(q, p, "freed object not reused first");
    cr_assert_eq(gsi_link_load(s, (uint32_t)idx), GS_LINK_ALLOCATED);
    free(q);
    free(keep);
}

/* Thousands of live objects of every class: distinct, 16-aligned, each
   inside its slab, and their usable ranges never overlap. */
Test(slab, objects_do_not_overlap)
{
    enum { PER = 300 };
    static uintptr_t ptrs[GS_NCLASSES * PER];
    size_t n = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        size_t size = gsi_classes[c].size;
        for (int i = 0; i < PER; i++) {
            char *p = malloc(size - (size_t)i % 16);
            cr_assert_not_null(p);
            cr_assert_eq((uintptr_t)p % 16, 0);
            struct gs_slab *s = gsi_slab_of(p);
            cr_assert_eq(s->obj_size, size);
            gst_fill(p, size, (uintptr_t)p);
            ptrs[n++] = (uintptr_t)p;
        }
    }
    qsort(ptrs, n, sizeof ptrs[0], cmp_ptr);
    for (size_t i = 0; i + 1 < n; i++)
        cr_assert_leq(ptrs[i] + gs_usable_size((void *)ptrs[i]), ptrs[i + 1],
                      "blocks %#lx and %#lx overlap", (unsigned long)ptrs[i],
                      (unsigned long)ptrs[i + 1]);
    for (size_t i = 0; i < n; i++) {
        void *p = (void *)ptrs[i];
        size_t size = gs_usable_size(p);
        cr_assert_eq(gst_check(p, size, ptrs[i]), size, "block %p corrupted", p);
        free(p);
    }
}

struct remote_job {
    void **ptrs;
    int n;
};

static void *free_all(void *arg)
{
    struct remote_job *j = arg;
    for (int i = 0; i < j->n; i++)
        free(j->ptrs[i]);
    return NULL;
}

static void run_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

/* A thread's remote frees into one slab are batched: claimed at once
   (links REMOTE, so a double free is still caught), pushed onto the
   owner's remote chain with one CAS when the batch is full, when the
   thread frees into another slab, or when it exits. */
struct batch_job {
    void **a;      /* objects of one slab */
    int na;
    void *other;   /* an object of another slab */
    struct gs_slab *s;
    uint32_t count_before_switch, count_after_switch;
    uint16_t link_before_switch;
};

static void *free_batched(void *arg)
{
    struct batch_job *j = arg;
    for (int i = 0; i < j->na; i++)
        free(j->a[i]);
    j->count_before_switch = GS_X_COUNT(atomic_load(&j->s->xstate));
    j->link_before_switch = gsi_link_load(j->s, (uint32_t)gsi_slab_index(j->s, j->a[0]));
    free(j->other);
    j->count_after_switch = GS_X_COUNT(atomic_load(&j->s->xstate));
    return NULL;
}

Test(slab, remote_frees_batched)
{
    enum { N = 5, FULL = GS_REMOTE_BATCH };
    static void *a[FULL + N];
    void *keep = malloc(96);
    struct gs_slab *s = gsi_slab_of(keep);
    for (int i = 0; i < FULL + N; i++) {
        a[i] = malloc(96);
        cr_assert_eq(gsi_slab_of(a[i]), s, "objects not from one slab");
    }
    void *other = malloc(3000);
    cr_assert_neq(gsi_slab_of(other), s);

    /* N frees, then a free into another slab. */
    struct batch_job j = {a, N, other, s, 0, 0, 0};
    run_thread(free_batched, &j);
    cr_assert_eq(j.count_before_switch, 0, "remote frees pushed one by one");
    cr_assert_eq(j.link_before_switch & ~GS_LINK_INDEX, GS_LINK_REMOTE,
                 "batched object not claimed (link %#x)", j.link_before_switch);
    cr_assert_eq(j.count_after_switch, N, "batch not pushed when the thread moved on");

    /* A full batch goes at once; the rest when the thread exits. */
    struct batch_job k = {a + N, FULL, NULL, s, 0, 0, 0};
    void *extra[1] = {malloc(96)};
    cr_assert_eq(gsi_slab_of(extra[0]), s);
    k.other = extra[0]; /* same slab: no switch */
    run_thread(free_batched, &k);
    cr_assert_geq(k.count_before_switch, N + FULL, "full batch not pushed");
    cr_assert_eq(GS_X_COUNT(atomic_load(&s->xstate)), N + FULL + 1, "batch lost at thread exit");
    cr_assert_eq(gsi_slab_collect(s), N + FULL + 1);
    free(keep);
}

/* Another thread's frees go on the remote chain (links marked REMOTE, the
   count in xstate); the owner's collect moves them to its local list. */
Test(slab, remote_frees_chain_and_collect)
{
    enum { N = 10 };
    void *ptrs[N];
    void *keep = malloc(200);
    struct gs_slab *s = gsi_slab_of(keep);
    for (int i = 0; i < N; i++) {
        ptrs[i] = malloc(200);
        cr_assert_eq(gsi_slab_of(ptrs[i]), s, "objects not from the active slab");
    }
    uint64_t used = s->used;
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), gsi_tls_heap->id);
    struct remote_job j = {ptrs, N};
    run_thread(free_all, &j);
    uint64_t x = atomic_load(&s->xstate);
    cr_assert_eq(GS_X_OWNER(x), gsi_tls_heap->id, "remote free changed the owner");
    cr_assert_eq(GS_X_COUNT(x), N);
    for (int i = 0; i < N; i++) {
        uint16_t v = gsi_link_load(s, (uint32_t)gsi_slab_index(s, ptrs[i]));
        cr_assert_eq(v & ~GS_LINK_INDEX, GS_LINK_REMOTE, "link %#x not remote", v);
    }
    cr_assert_eq(s->used, used, "remote frees touched the owner's count");
    cr_assert_eq(gsi_slab_collect(s), N);
    cr_assert_eq(s->used, used - N);
    cr_assert_eq(GS_X_COUNT(atomic_load(&s->xstate)), 0);
    for (int i = 0; i < N; i++) {
        uint16_t v = gsi_link_load(s, (uint32_t)gsi_slab_index(s, ptrs[i]));
        cr_assert_leq(v, GS_LINK_END, "collected link %#x not on the local list", v);
    }
    free(keep);
}

struct exhaust {
    unsigned cls;
    void **ptrs;
    uint32_t n;
    struct gs_slab *slab;
};

/* Fills one whole slab of a class from a fresh thread, which then exits. */
static void *fill_slab(void *arg)
{
    struct exhaust *e = arg;
    size_t size = gsi_classes[e->cls].size;
    void *first = malloc(size);
    e->slab = gsi_slab_of(first);
    e->ptrs[e->n++] = first;
    /* Allocate until the slab is exhausted (next object from another). */
    for (;;) {
        void *p = malloc(size);
        if (gsi_slab_of(p) != e->slab) {
            free(p);
            break;
        }
        e->ptrs[e->n++] = p;
    }
    return NULL;
}

/* An exhausted slab is given up (ownerless); the first free into it from
   another thread adopts it, and freeing everything retires it. */
Test(slab, exhausted_slab_released_and_adopted_by_free)
{
    /* Retirement at once is what this checks: heaps keep no empty slab
       (each Criterion test runs in its own process). */
    gsi_option_set(GSI_OPT_HEAP_EMPTY_KB, 0);
    static void *ptrs[GS_MAX_OBJECTS];
    struct exhaust e = {gsi_size_class(512), ptrs, 0, NULL};
    run_thread(fill_slab, &e);
    cr_assert_eq(e.n, e.slab->capacity, "slab had %u objects, capacity %u", e.n,
                 e.slab->capacity);
    struct gs_slab *s = e.slab;
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), 0, "exhausted slab still owned");
    free(ptrs[0]);
    struct gs_heap *me = gsi_tls_heap;
    cr_assert_eq(GS_X_OWNER(atomic_load(&s->xstate)), me->id, "free did not adopt the slab");
    cr_assert_eq(atomic_load(&s->owner_key), me->key);
    cr_assert_eq(s->used, e.n - 1);
    for (uint32_t i = 1; i < e.n; i++)
        free(ptrs[i]);
    cr_assert_neq(gsi_slab_of(ptrs[0]), s, "empty adopted slab not retired");
}

/* A slab formatted on slots that held other objects (bytes 0xFF here, as a
   program may leave them; for the classes with links in the segment header,
   the row a previous slab of the slot used): every object not linked yet
   reads UNUSED, never ALLOCATED, whatever its link's bytes were. Formatted
   at slot 1 of a segment-aligned mapping of the test's own, so that the
   header is there. */
Test(slab, format_marks_unlinked_objects_unused)
{
    static struct gs_slab s;
    gsi_heap_init_once(); /* the class table */
    char *map = mmap(NULL, 2 * GS_SEGMENT_SIZE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(map, MAP_FAILED);
    char *seg_base = (char *)(((uintptr_t)map + GS_SEGMENT_MASK) & ~GS_SEGMENT_MASK);
    struct gs_segment *seg = (struct gs_segment *)seg_base;
    char *base = seg_base + GS_SLOT_SIZE;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        const struct gs_class_info *ci = &gsi_classes[c];
        memset(seg_base, 0xFF, GS_SEGMENT_SIZE);
        gsi_slab_format(&s, base, c);
        for (uint32_t i = 0; i < s.capacity; i++)
            cr_assert_eq(gsi_link_load(&s, i), GS_LINK_UNUSED, "class %u, object %u", c, i);
        cr_assert_eq(gsi_link_load(&s, s.capacity), GS_LINK_INVALID);
        if (gsi_class_header_links(ci)) {
            /* Slot 1's row of the header; the objects from the slab's
               first byte. */
            cr_assert_eq(s.link, seg->slot_links[1], "class %u", c);
            cr_assert_eq(s.start, base, "class %u", c);
        } else {
            cr_assert_geq((char *)s.link, base, "class %u", c);
            cr_assert_leq((char *)(s.link + s.capacity + 1), s.start, "class %u", c);
        }
        cr_assert_leq(s.start + (size_t)s.capacity * s.obj_size, base + ci->span * GS_SLOT_SIZE,
                      "class %u", c);
    }
    munmap(map, 2 * GS_SEGMENT_SIZE);
}

/* End to end: 1000-byte blocks full of 0xFF are freed, their slots go back
   to the segment still committed, and 16-byte slabs are formatted on them
   (their link arrays are longer and reach into the old objects). A free of
   one of those slabs' objects that was never handed out aborts; it used to
   read 0xFFFF, pass for allocated, and put the object on the free list
   twice. */
static void free_never_allocated_on_reused_slots(void *arg)
{
    (void)arg;
    /* The old blocks' slabs must go back to their segment: the heap keeps
       only its own 2 MiB, none from the shared budget. */
    gsi_option_set(GSI_OPT_HEAP_SHARED_KEEP_MB, 0);
    enum { OLD = 9000, NEW = 200000 };
    void **old = gst_raw_array(OLD), **new = gst_raw_array(NEW);
    for (int i = 0; i < OLD; i++) {
        old[i] = malloc(1000);
        memset(old[i], 0xFF, 1000);
    }
    for (int i = 0; i < OLD; i++)
        free(old[i]);
    struct gs_slab *seen = NULL;
    for (int i = 0; i < NEW; i++) {
        new[i] = malloc(16);
        struct gs_slab *s = gsi_slab_of(new[i]);
        if (s == seen || s->bump + 1 >= s->capacity)
            continue;
        seen = s;
        /* Only a slab on the old blocks' slots tests what it should. */
        char *end = s->start + (size_t)s->capacity * s->obj_size;
        bool reused = false;
        for (int j = 0; j < OLD && !reused; j++)
            reused = (char *)old[j] >= s->start && (char *)old[j] < end;
        if (reused) {
            void *p = s->start + (size_t)(s->capacity - 1) * s->obj_size;
            gst_child_report_ptr(p);
            free(p);
            gst_child_fail("free of an object never handed out returned");
        }
    }
    gst_child_fail("no 16-byte slab on the old blocks' slots");
}

Test(slab, free_of_never_allocated_object_aborts)
{
    struct gst_child c;
    void *ptr;
    char why[4300];
    cr_assert(gst_run_child_ptr(free_never_allocated_on_reused_slots, NULL, &c, &ptr));
    cr_assert_not_null(ptr, "child did not report its pointer; stderr: \"%s\"", c.err);
    cr_assert(gst_fatal_line_ok(&c, (const char *const[]){"free", NULL}, ptr, why, sizeof why),
              "%s", why);
    cr_assert(strstr(c.err, "never allocated"), "message: \"%s\"", c.err);
}
