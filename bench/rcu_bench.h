/*
 * Helpers shared by the bench/rcu_*.c programs: clock, median, and the
 * context-switch count of one thread from /proc. Benchmarks only.
 */
#ifndef GS_RCU_BENCH_H
#define GS_RCU_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double rb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int rb_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double rb_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, rb_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* "name=value" argument, or dflt. */
static inline double rb_arg(int argc, char **argv, const char *name, double dflt)
{
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], name, len) == 0 && argv[i][len] == '=')
            return atof(argv[i] + len + 1);
    return dflt;
}

/* Peak RSS of the process (VmHWM), KiB; -1 if unknown. */
static inline long rb_peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

#endif
