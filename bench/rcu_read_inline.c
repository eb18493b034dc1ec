/*
 * rcu_read's graceslab inlined case: the read side of graceslab.h with
 * GRACESLAB_RCU_INLINE, in its own file because the macro turns every
 * gs_rcu_read_lock/unlock of a file into the inline version.
 */
#define GRACESLAB_RCU_INLINE
#include "graceslab.h"
#include "rcu_bench.h"

double rcu_read_gs_inline(long iters);

double rcu_read_gs_inline(long iters)
{
    double t0 = rb_now();
    for (long i = 0; i < iters; i++) {
        gs_rcu_read_lock();
        gs_rcu_read_unlock();
    }
    return (rb_now() - t0) * 1e9 / (double)iters;
}
