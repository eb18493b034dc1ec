/*
 * Options: one table, filled once from GRACESLAB_* environment variables.
 * Parsing uses getenv(3) (which does not allocate) and a hand-written
 * decimal parser, so it is safe from the first malloc of the process.
 *
 * | variable                        | default | meaning                                   |
 * |---------------------------------|---------|-------------------------------------------|
 * | GRACESLAB_STATS                 | 0       | 1: print a statistics summary at exit     |
 * | GRACESLAB_PURGE_DELAY_MS        | 100     | empty slabs kept this long before madvise  |
 * | GRACESLAB_EMPTY_CACHE_MB        | 32      | empty slabs kept (or half the slabs' committed bytes; up to 2x after refaults) before immediate madvise |
 * | GRACESLAB_HEAP_EMPTY_KB         | 2048    | empty slabs a thread heap keeps for reuse (0: none) |
 * | GRACESLAB_HEAP_SHARED_KEEP_MB   | 16      | more empty slabs heaps may keep, all heaps together |
 * | GRACESLAB_HEAP_EMPTY_TOTAL_MB   | 32      | bound on all heaps' own keeps (HEAP_EMPTY_KB each) together |
 * | GRACESLAB_LARGE_CACHE_MB        | 64      | freed large blocks kept for reuse, and slack of reused ones (bytes; or the live large bytes if more) |
 * | GRACESLAB_RCU_LAZY_MS           | 1000    | lazy call_rcu / pending-reclaim timeout   |
 * | GRACESLAB_RCU_LAZY_BATCH        | 10000   | lazy callbacks queued before a GP starts  |
 * | GRACESLAB_RCU_FENCES            | 0       | 1: fence read side even with membarrier   |
 * | GRACESLAB_PENDING_EXPEDITE_KB   | 256     | pending bytes in a class that make refill start a GP |
 * | GRACESLAB_VALGRIND              | 1       | under memcheck: 1 reports blocks with client requests, 0 does not |
 * | GRACESLAB_OS_FAIL_AFTER_MB      | 0       | fault injection: OS refuses memory past this much (0: off) |
 * | GRACESLAB_DEEPBIND              | 0       | 1: dlopen keeps RTLD_DEEPBIND (0: cleared, see dlopen.c) |
 * | GRACESLAB_DECAY_MS              | 1000    | medium objects free at two passes this far apart go back to the OS; so do kept empty slabs not reused |
 * Values above OPTION_MAX count as OPTION_MAX; none are read in secure
 * execution (set-user-ID programs).
 */
#include "alloc/common.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/auxv.h>

struct option_def {
    const char *env;
    long dflt;
};

static const struct option_def option_defs[GSI_OPT_COUNT] = {
    [GSI_OPT_STATS] = {"GRACESLAB_STATS", 0},
    [GSI_OPT_PURGE_DELAY_MS] = {"GRACESLAB_PURGE_DELAY_MS", 100},
    [GSI_OPT_EMPTY_CACHE_MB] = {"GRACESLAB_EMPTY_CACHE_MB", 32},
    [GSI_OPT_HEAP_EMPTY_KB] = {"GRACESLAB_HEAP_EMPTY_KB", 2048},
    [GSI_OPT_HEAP_SHARED_KEEP_MB] = {"GRACESLAB_HEAP_SHARED_KEEP_MB", 16},
    [GSI_OPT_HEAP_EMPTY_TOTAL_MB] = {"GRACESLAB_HEAP_EMPTY_TOTAL_MB", 32},
    [GSI_OPT_LARGE_CACHE_MB] = {"GRACESLAB_LARGE_CACHE_MB", 64},
    [GSI_OPT_RCU_LAZY_MS] = {"GRACESLAB_RCU_LAZY_MS", 1000},
    [GSI_OPT_RCU_LAZY_BATCH] = {"GRACESLAB_RCU_LAZY_BATCH", 10000},
    [GSI_OPT_RCU_FENCES] = {"GRACESLAB_RCU_FENCES", 0},
    [GSI_OPT_PENDING_EXPEDITE_KB] = {"GRACESLAB_PENDING_EXPEDITE_KB", 256},
    [GSI_OPT_OS_FAIL_AFTER_MB] = {"GRACESLAB_OS_FAIL_AFTER_MB", 0},
    [GSI_OPT_VALGRIND] = {"GRACESLAB_VALGRIND", 1},
    [GSI_OPT_DEEPBIND] = {"GRACESLAB_DEEPBIND", 0},
    [GSI_OPT_DECAY_MS] = {"GRACESLAB_DECAY_MS", 1000},
};

/* Parsed values. Written once by whichever thread parses first; the parse is
   idempotent, so racing parsers store identical values and the relaxed
   accesses need no further ordering: options_ready's release/acquire pair
   publishes the table. */
static long option_values[GSI_OPT_COUNT];
static atomic_bool options_ready;

static bool parse_long(const char *s, long *out)
{
    long v = 0;
    if (!s || !*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        /* Saturate: however many digits, a decimal number above the cap
           is the cap (options_parse), as the README says. */
        if (v <= (__LONG_MAX__ - 9) / 10)
            v = v * 10 + (*s - '0');
    }
    *out = v;
    return true;
}

/* Values are scaled by their users (MiB << 20, KiB << 10, ms * 10^6):
   cap them so that no product wraps (2^44 MiB would be a 0-byte limit). */
#define OPTION_MAX ((long)1 << 40)

/* Out of line: inlined, it made gsi_option() save six registers on every
   call (21 instructions instead of 7). */
static GS_COLD void options_parse(void)
{
    /* A set-user-ID or set-group-ID program (AT_SECURE) takes no options
       from its unprivileged caller: fault injection and the statistics
       summary stay off there, as glibc ignores its malloc tunables. */
    bool secure = getauxval(AT_SECURE) != 0;
    for (int i = 0; i < GSI_OPT_COUNT; i++) {
        long v;
        if (secure || !parse_long(getenv(option_defs[i].env), &v))
            v = option_defs[i].dflt;
        if (v > OPTION_MAX)
            v = OPTION_MAX;
        __atomic_store_n(&option_values[i], v, __ATOMIC_RELAXED);
    }
    /* Pairs with the acquire load in gsi_option(). */
    atomic_store_explicit(&options_ready, true, memory_order_release);
}

void gsi_option_set(enum gsi_option opt, long value)
{
    gsi_option(opt); /* parse the rest first */
    __atomic_store_n(&option_values[opt], value, __ATOMIC_RELAXED);
}

long gsi_option(enum gsi_option opt)
{
    if (GS_UNLIKELY(!atomic_load_explicit(&options_ready, memory_order_acquire)))
        options_parse();
    return __atomic_load_n(&option_values[opt], __ATOMIC_RELAXED);
}
