/*
 * Statistics: gs_stats_get() and the GRACESLAB_STATS=1 summary at exit.
 * Counts come from walking the slabs (exact at the moment each slab is
 * read) rather than from counters on the fast paths, which stay free of
 * bookkeeping.
 */
#include "alloc/internal.h"

#include <string.h>
#include <unistd.h>

_Atomic size_t gsi_large_live_bytes;

static void count_slab(struct gs_slab *s, void *arg)
{
    struct gs_stats *st = arg;
    st->slabs++;
    /* Read racily; the active slab's count is an advance charge (see
       struct gs_slab), so it is counted from its lists instead. Either
       counts the objects on the remote chain, which are freed (another
       thread's free, or a reclaim done for this heap elsewhere) but not
       yet collected by the owner: not allocated any more. */
    uint64_t used = s->where == GS_IN_ACTIVE   ? gsi_slab_recount(s)
                    : s->where == GS_IN_PARKED ? s->capacity
                                               : s->used;
    uint64_t remote = GS_X_COUNT(atomic_load_explicit(&s->xstate, memory_order_relaxed));
    st->class_allocated[s->cls] += used > remote ? used - remote : 0;
}

static void count_heap(struct gs_heap *h, void *arg)
{
    (void)h;
    (*(size_t *)arg)++;
}

GS_EXPORT void gs_stats_get(struct gs_stats *out)
{
    memset(out, 0, sizeof *out);
    gsi_heap_init_once();
    /* The caller's own remote frees count as freed (other threads' last
       few, batched, may still count as allocated: see GS_REMOTE_BATCH). */
    if (gsi_tls_mine != &gsi_empty_heap)
        gsi_remote_flush(gsi_tls_mine);
    out->nclasses = GS_NCLASSES;
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        out->class_size[c] = gsi_classes[c].size;
    gsi_segments_foreach(count_slab, out);
    gsi_pending_stats(out);
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        /* A slab's used count includes its pending objects. */
        size_t pend = out->class_pending_objects[c];
        out->class_allocated[c] = out->class_allocated[c] > pend ? out->class_allocated[c] - pend : 0;
        out->allocated_bytes += out->class_allocated[c] * out->class_size[c];
    }
    out->large_bytes = atomic_load_explicit(&gsi_large_live_bytes, memory_order_relaxed);
    out->allocated_bytes += out->large_bytes;
    out->mapped_bytes = atomic_load_explicit(&gsi_os_mapped_bytes, memory_order_relaxed);
    /* (Negative only in a fork child that caught a decay pass half done.) */
    int64_t decayed = atomic_load_explicit(&gsi_decayed_bytes, memory_order_relaxed);
    size_t decommitted = gsi_segments_decommitted() + (decayed > 0 ? (size_t)decayed : 0);
    out->committed_bytes = out->mapped_bytes > decommitted ? out->mapped_bytes - decommitted : 0;
    out->segments = gsi_segments_count();
    size_t heaps = 0;
    gsi_heaps_foreach(count_heap, &heaps);
    out->heaps = heaps;
}

/* ------------------------------------------------------- exit summary */

static size_t put_str(char *buf, size_t at, const char *s)
{
    while (*s && at < 4000)
        buf[at++] = *s++;
    return at;
}

static size_t put_num(char *buf, size_t at, size_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n && at < 4000)
        buf[at++] = tmp[--n];
    return at;
}

void gsi_stats_print(void)
{
    struct gs_stats st;
    gs_stats_get(&st);
    char buf[4096];
    size_t n = 0;
    /* label, value pairs of the two summary lines */
    const struct { const char *label; size_t value; } fields[] = {
        {"graceslab stats: mapped ", st.mapped_bytes >> 10},
        {" KiB, committed ", st.committed_bytes >> 10},
        {" KiB, allocated ", st.allocated_bytes >> 10},
        {" KiB (large ", st.large_bytes >> 10},
        {" KiB), segments ", st.segments},
        {", slabs ", st.slabs},
        {", empty-slab budget ", gsi_segments_empty_budget() >> 10},
        {" KiB (refault boost ", gsi_segments_budget_boost() >> 10},
        {" KiB)\ngraceslab stats: pending ", st.pending_objects},
        {" objects / ", st.pending_bytes},
        {" bytes, reclaimed ", st.reclaimed_objects},
        {" objects, grace periods ", st.gp_completed},
        {"/", st.gp_started},
    };
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        n = put_str(buf, n, fields[f].label);
        n = put_num(buf, n, fields[f].value);
    }
    n = put_str(buf, n, " completed/started\n");
    for (unsigned c = 0; c < st.nclasses; c++) {
        if (!st.class_allocated[c] && !st.class_pending_objects[c])
            continue;
        n = put_str(buf, n, "graceslab stats:   class ");
        n = put_num(buf, n, st.class_size[c]);
        n = put_str(buf, n, " B: live ");
        n = put_num(buf, n, st.class_allocated[c]);
        n = put_str(buf, n, ", pending ");
        n = put_num(buf, n, st.class_pending_objects[c]);
        n = put_str(buf, n, "\n");
    }
    ssize_t ignored = write(STDERR_FILENO, buf, n);
    (void)ignored;
}

static void __attribute__((destructor)) stats_at_exit(void)
{
    if (gsi_option(GSI_OPT_STATS))
        gsi_stats_print();
}
