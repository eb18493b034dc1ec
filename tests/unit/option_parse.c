/*
 * GRACESLAB_* values as README's table says they are read: decimal
 * digits only (anything else keeps the default), and a number above 2^40,
 * however many digits it has, counts as 2^40. The options are parsed at
 * the first allocation, before main, so the program re-executes itself
 * with the values in its environment. Linked with libgraceslab.a (it
 * reads the parsed values with gsi_option). Exit status 0, or 1 with a
 * line on stderr per wrong value.
 */
#include "alloc/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CAP ((long)1 << 40)

static const struct {
    enum gsi_option opt;
    const char *env, *value;
    long want; /* -1: the default */
} cases[] = {
    {GSI_OPT_PURGE_DELAY_MS, "GRACESLAB_PURGE_DELAY_MS", "99999999999999999999", CAP},
    {GSI_OPT_EMPTY_CACHE_MB, "GRACESLAB_EMPTY_CACHE_MB", "1099511627777", CAP},
    {GSI_OPT_LARGE_CACHE_MB, "GRACESLAB_LARGE_CACHE_MB", "9223372036854775808", CAP},
    {GSI_OPT_DECAY_MS, "GRACESLAB_DECAY_MS", "007", 7},
    {GSI_OPT_HEAP_EMPTY_KB, "GRACESLAB_HEAP_EMPTY_KB", "abc", -1},
    {GSI_OPT_HEAP_SHARED_KEEP_MB, "GRACESLAB_HEAP_SHARED_KEEP_MB", "-5", -1},
    {GSI_OPT_HEAP_EMPTY_TOTAL_MB, "GRACESLAB_HEAP_EMPTY_TOTAL_MB", "1e3", -1},
    {GSI_OPT_RCU_LAZY_BATCH, "GRACESLAB_RCU_LAZY_BATCH", "", -1},
    {GSI_OPT_PENDING_EXPEDITE_KB, "GRACESLAB_PENDING_EXPEDITE_KB", " 5", -1},
};
#define NCASES (sizeof cases / sizeof cases[0])

int main(int argc, char **argv)
{
    if (argc < 2) { /* first run: the defaults, then the values */
        long dflt[NCASES];
        for (size_t i = 0; i < NCASES; i++)
            dflt[i] = gsi_option(cases[i].opt);
        for (size_t i = 0; i < NCASES; i++)
            setenv(cases[i].env, cases[i].value, 1);
        char args[NCASES][24];
        char *child[NCASES + 2];
        child[0] = argv[0];
        for (size_t i = 0; i < NCASES; i++) {
            snprintf(args[i], sizeof args[i], "%ld", dflt[i]);
            child[i + 1] = args[i];
        }
        child[NCASES + 1] = NULL;
        execv("/proc/self/exe", child);
        perror("option_parse: exec");
        return 1;
    }
    int fails = 0;
    for (size_t i = 0; i < NCASES; i++) {
        long want = cases[i].want < 0 ? atol(argv[i + 1]) : cases[i].want;
        long got = gsi_option(cases[i].opt);
        if (got != want) {
            fprintf(stderr, "option_parse: %s=\"%s\" read as %ld, expected %ld\n", cases[i].env,
                    cases[i].value, got, want);
            fails++;
        }
    }
    if (!fails)
        printf("option_parse: ok (%zu values)\n", NCASES);
    return fails != 0;
}
