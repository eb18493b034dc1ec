/*
 * rcu_read: cost of one read-side lock+unlock pair, graceslab vs
 * liburcu-memb, in one run, same machine.
 *   gs call        gs_rcu_read_lock/unlock through libgraceslab.so (PLT call)
 *   gs inlined     graceslab.h's inline read side (GRACESLAB_RCU_INLINE,
 *                  rcu_read_inline.c)
 *   urcu call      urcu_memb_read_lock/unlock through liburcu-memb.so
 *   urcu inlined   liburcu's static inline read side (_LGPL_SOURCE style)
 * Medians of `rounds` runs of `iters` pairs. Args: iters=N rounds=N.
 * The graceslab read side runs in the mode the engine picked (membarrier
 * when the kernel has it; GRACESLAB_RCU_FENCES=1 forces fences).
 */
#include "graceslab.h"
#include "rcu_bench.h"

#include <urcu/urcu-memb.h>
#include <urcu/static/urcu-memb.h>

static double run_gs(long iters)
{
    double t0 = rb_now();
    for (long i = 0; i < iters; i++) {
        gs_rcu_read_lock();
        gs_rcu_read_unlock();
    }
    return (rb_now() - t0) * 1e9 / (double)iters;
}

double rcu_read_gs_inline(long iters); /* rcu_read_inline.c */

static double run_urcu_call(long iters)
{
    double t0 = rb_now();
    for (long i = 0; i < iters; i++) {
        urcu_memb_read_lock();
        urcu_memb_read_unlock();
    }
    return (rb_now() - t0) * 1e9 / (double)iters;
}

static double run_urcu_inline(long iters)
{
    double t0 = rb_now();
    for (long i = 0; i < iters; i++) {
        _urcu_memb_read_lock();
        _urcu_memb_read_unlock();
    }
    return (rb_now() - t0) * 1e9 / (double)iters;
}

int main(int argc, char **argv)
{
    long iters = (long)rb_arg(argc, argv, "iters", 20e6);
    int rounds = (int)rb_arg(argc, argv, "rounds", 11);
    if (rounds > 101)
        rounds = 101;
    double gs[101], gi[101], uc[101], ui[101];
    urcu_memb_register_thread();
    gs_rcu_register_thread();
    run_gs(iters / 10); /* warm up */
    rcu_read_gs_inline(iters / 10);
    run_urcu_call(iters / 10);
    run_urcu_inline(iters / 10);
    for (int r = 0; r < rounds; r++) { /* interleaved */
        gs[r] = run_gs(iters);
        gi[r] = rcu_read_gs_inline(iters);
        uc[r] = run_urcu_call(iters);
        ui[r] = run_urcu_inline(iters);
    }
    double mg = rb_median(gs, rounds), mgi = rb_median(gi, rounds);
    double mc = rb_median(uc, rounds), mi = rb_median(ui, rounds);
    printf("rcu_read: lock+unlock pair, median of %d x %ld\n", rounds, iters);
    printf("  graceslab (call)        %7.2f ns\n", mg);
    printf("  graceslab (inlined)     %7.2f ns\n", mgi);
    printf("  liburcu-memb (call)     %7.2f ns\n", mc);
    printf("  liburcu-memb (inlined)  %7.2f ns\n", mi);
    printf("  ratio gs/urcu (call)    %7.2f\n", mg / mc);
    printf("  ratio gs/urcu (inlined) %7.2f\n", mgi / mi);
    printf("RESULT rcu_read gs_call_ns=%.2f gs_inline_ns=%.2f urcu_call_ns=%.2f "
           "urcu_inline_ns=%.2f\n", mg, mgi, mc, mi);
    urcu_memb_unregister_thread();
    return 0;
}
