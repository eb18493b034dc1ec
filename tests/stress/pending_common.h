/*
 * Helpers shared by the deferred-free stress tests (pending_torture.c,
 * pending_membound.c): run-length knobs from the environment, CPU
 * oversubscription, peak RSS.
 */
#ifndef GS_TESTS_PENDING_COMMON_H
#define GS_TESTS_PENDING_COMMON_H

#include "tests/common.h"

#include <sched.h>
#include <stdlib.h>

/* A non-negative integer from the environment, or dflt. */
static inline unsigned long gsp_env_ulong(const char *name, unsigned long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    return *end ? dflt : v;
}

/* Updates to run: GS_TORTURE_UPDATES, or dflt. */
static inline unsigned long gsp_updates(unsigned long dflt)
{
    return gsp_env_ulong("GS_TORTURE_UPDATES", dflt);
}

/* Minimum run time in seconds: GS_TORTURE_SECONDS, or 0. */
static inline double gsp_seconds(void)
{
    return (double)gsp_env_ulong("GS_TORTURE_SECONDS", 0);
}

/* Restricts the process (and the threads it creates afterwards) to at most
   ncpu of its CPUs, so that more threads than CPUs really oversubscribe.
   Returns the number of CPUs kept. */
static inline int gsp_limit_cpus(int ncpu)
{
    cpu_set_t set, keep;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    CPU_ZERO(&keep);
    int kept = 0;
    for (int c = 0; c < CPU_SETSIZE && kept < ncpu; c++)
        if (CPU_ISSET(c, &set)) {
            CPU_SET(c, &keep);
            kept++;
        }
    sched_setaffinity(0, sizeof keep, &keep);
    return kept;
}

/* A "Vm...:" field of /proc/self/status in bytes, or 0. */
static inline size_t gsp_status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t kb = 0, len = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, len) && line[len] == ':') {
            kb = strtoul(line + len + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb << 10;
}

/* Resets the peak RSS (VmHWM) to the current RSS; false if the kernel
   does not allow it (the caller then measures relative to the old peak). */
static inline bool gsp_reset_peak_rss(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

#endif /* GS_TESTS_PENDING_COMMON_H */
