/*
 * The inlined read side (GRACESLAB_RCU_INLINE) in a program linked with
 * libgraceslab.so, as a user's program is. The inline code reads the
 * grace-period state, gsi_rcu_gp_v3, by name: in a gcc-built executable
 * that is a copy relocation, the executable's own copy, which the library
 * must use as well (it reaches the object through its GOT). Were the two
 * split, the program would see the sequence stand still and the driver's
 * mark never set: the tests below would fail. test_rcu_inline links the
 * archive, where no copy exists, and cannot see this.
 * Only graceslab.h: no internals (the library exports none but these).
 */
#ifdef GS_RCU_MINI_CRITERION
#include <stdbool.h>
#include "rcu_mini_criterion.h"
#else
#include <criterion/criterion.h>
#endif

#define GRACESLAB_RCU_INLINE
#include "graceslab.h"

#include "../common.h"

static uint64_t program_seq(void)
{
    return __atomic_load_n(&gsi_rcu_gp_v3.seq, __ATOMIC_ACQUIRE);
}

static uint32_t program_waiting(void)
{
    return __atomic_load_n(&gsi_rcu_gp_v3.waiting, __ATOMIC_ACQUIRE);
}

Test(rcu_shared, program_reads_the_library_sequence)
{
    uint64_t before = program_seq();
    gs_synchronize_rcu();
    uint64_t after = program_seq();
    cr_assert_geq(after, before + 2, "a grace period ran, but the program's sequence went "
                                     "from %llu to %llu only",
                  (unsigned long long)before, (unsigned long long)after);
    /* Registered first, so that the lock below is the inline fast path
       (in membarrier mode; under TSan, the fence mode, it calls the
       library). No grace period runs now (nobody asks for one): the
       inline lock publishes the value the program reads. */
    gs_rcu_register_thread();
    cr_assert(gsi_rcu_self_view_v3.nested == 0 || gsi_rcu_self_view_v3.nested == GSI_RCU_NESTED_CALL);
    gs_rcu_read_lock();
    uint64_t snap = gsi_rcu_self_view_v3.snap;
    gs_rcu_read_unlock();
    cr_assert_eq(snap, after, "the inline lock saw %llu, the program %llu",
                 (unsigned long long)snap, (unsigned long long)after);
}

/* A thread that has never registered enters through the inline lock
   (whose first call must register it: the record starts with the call
   bit), stays until told, and reads the driver's mark right after its
   unlock. */
struct reader {
    pthread_t t;
    atomic_int inside, release;
    atomic_uint waiting_after_unlock;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    gs_rcu_read_lock();
    atomic_store(&r->inside, 1);
    while (!atomic_load(&r->release))
        gst_sleep_ms(1);
    gs_rcu_read_unlock();
    atomic_store(&r->waiting_after_unlock, program_waiting());
    atomic_store(&r->inside, 0);
    return NULL;
}

/* One round: a reader inside, a syncer whose driver sleeps on it, then the
   reader leaves. Returns the mark the program saw, and in *after what the
   reader read right after its unlock. */
static uint32_t hold_and_release(uint32_t *after)
{
    struct reader r;
    atomic_init(&r.inside, 0);
    atomic_init(&r.release, 0);
    atomic_init(&r.waiting_after_unlock, ~0u);
    cr_assert_eq(pthread_create(&r.t, NULL, reader_main, &r), 0);
    while (!atomic_load(&r.inside))
        gst_sleep_ms(1);

    struct gst_syncer s;
    cr_assert(gst_syncer_start(&s));
    /* The driver spins, then sleeps with its mark set: the program sees
       the mark in its copy. */
    for (int i = 0; i < 20000 && program_waiting() == 0 && !atomic_load(&s.done); i++)
        gst_sleep_ms(1);
    cr_assert_not(atomic_load(&s.done), "the grace period ended with a reader inside");
    uint32_t mark = program_waiting();
    cr_assert_neq(mark, 0, "the program never saw the driver's mark");

    atomic_store(&r.release, 1);
    pthread_join(r.t, NULL);
    pthread_join(s.t, NULL);
    cr_assert(atomic_load(&s.done));
    *after = atomic_load(&r.waiting_after_unlock);
    return mark;
}

Test(rcu_shared, inline_reader_holds_the_grace_period_and_wakes_the_driver, .timeout = 300)
{
    /* The reader's inline unlock sees the mark and wakes the driver, which
       clears it before the unlock returns. One interleaving sets it again
       meanwhile: the driver's 50 ms time-out expiring just then (it
       rescans, sees the reader still inside, and sets the same mark) and
       the reader's read coming before the driver clears it for good. So a
       round that reads the mark set is retried, twice at most: an unlock
       that never wakes the driver (a split state, say) leaves the mark set
       in every round. */
    uint32_t mark = 0, after = ~0u;
    for (int round = 0; round < 3 && after != 0; round++)
        mark = hold_and_release(&after);
    cr_assert_eq(after, 0, "the inline unlock left the driver's mark %u set, three rounds out of three",
                 mark);
}

Test(rcu_shared, nested_inline_sections_count)
{
    gs_rcu_read_lock();
    gs_rcu_read_lock();
    uint64_t snap = gsi_rcu_self_view_v3.snap;
    unsigned long depth = gsi_rcu_self_view_v3.nested & ~GSI_RCU_NESTED_CALL;
    gs_rcu_read_unlock();
    uint64_t snap_inner_unlocked = gsi_rcu_self_view_v3.snap;
    gs_rcu_read_unlock();
    cr_assert_eq(depth, 1);
    cr_assert(snap != 0 && snap_inner_unlocked == snap, "the inner unlock ended the section");
    cr_assert_eq(gsi_rcu_self_view_v3.snap, 0);
}
