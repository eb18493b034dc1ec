/* Helpers for the benchmark programs; see common.h. */
#include "common.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

atomic_int bench_stop;

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_arg(int argc, char **argv, const char *key, double def)
{
    size_t klen = strlen(key);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], key, klen) != 0 || argv[i][klen] != '=')
            continue;
        char *end;
        double v = strtod(argv[i] + klen + 1, &end);
        switch (*end) {
        case 'k': case 'K': v *= 1024.0; break;
        case 'm': case 'M': v *= 1024.0 * 1024.0; break;
        case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
        default: break;
        }
        return v;
    }
    return def;
}

long bench_peak_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

long bench_rss_kb(void)
{
    /* open/read on a stack buffer rather than stdio, so that taking the
       reading does not itself allocate. statm: "size resident ..." pages. */
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strchr(buf, ' ');
    if (!p)
        return -1;
    return strtol(p + 1, NULL, 10) * (sysconf(_SC_PAGESIZE) / 1024);
}

void *bench_check(void *p, const char *what)
{
    if (!p) {
        fprintf(stderr, "bench: %s failed\n", what);
        abort();
    }
    return p;
}

static double process_cpu_secs(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static double cpu_mark;

void bench_cpu_mark(void)
{
    cpu_mark = process_cpu_secs();
}

void bench_result(const char *name, const char *extra, double ops, double secs)
{
    double cpu = process_cpu_secs() - cpu_mark;
    printf("RESULT name=%s%s ops=%.0f secs=%.4f ops_per_sec=%.1f cpu_secs=%.4f"
           " peak_rss_kb=%ld\n",
           name, extra, ops, secs, secs > 0 ? ops / secs : 0.0, cpu, bench_peak_rss_kb());
    fflush(stdout);
}

void *bench_thread_args(int n, size_t size)
{
    void *p = bench_check(aligned_alloc(64, (size_t)n * size), "aligned_alloc");
    return memset(p, 0, (size_t)n * size);
}

double bench_run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size,
                         double seconds, double *ops)
{
    pthread_t *tid = bench_check(calloc((size_t)n, sizeof *tid), "calloc");
    atomic_store(&bench_stop, 0);
    double t0 = bench_now();
    for (int i = 0; i < n; i++)
        if (pthread_create(&tid[i], NULL, fn, (char *)args + (size_t)i * arg_size)) {
            fprintf(stderr, "bench: pthread_create failed\n");
            abort();
        }
    struct timespec ts = { (time_t)seconds,
                           (long)((seconds - (double)(time_t)seconds) * 1e9) };
    while (nanosleep(&ts, &ts) != 0)
        ;
    atomic_store(&bench_stop, 1);
    *ops = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(tid[i], NULL);
        *ops += ((struct bench_thread *)((char *)args + (size_t)i * arg_size))->ops;
    }
    double t = bench_now() - t0;
    free(tid);
    return t;
}

long bench_replace_slots(void **slot, size_t n, uint64_t *rng, size_t lo, size_t hi,
                         long steps)
{
    long done = 0;
    while (steps < 0 || done < steps) {
        for (int k = 0; k < 256; k++) {
            size_t i = (size_t)(bench_rand(rng) % n);
            free(slot[i]);
            size_t *p = malloc(bench_rand_range(rng, lo, hi));
            *p = i;
            slot[i] = p;
        }
        done += 256;
        if (bench_stopped())
            break;
    }
    return done;
}

unsigned bench_octaves(size_t lo, size_t hi)
{
    unsigned octaves = 0;
    while ((lo << (octaves + 1)) <= hi)
        octaves++;
    return octaves;
}

size_t bench_rand_log_size(uint64_t *state, size_t lo, size_t hi, unsigned octaves)
{
    uint64_t r = bench_rand(state);
    size_t base = lo << (octaves ? r % (octaves + 1) : 0);
    size_t n = base + (size_t)((r >> 8) % base);
    return n > hi ? hi : n;
}

void *bench_alloc_log_written(uint64_t *state, size_t lo, size_t hi, unsigned octaves, size_t min,
                              size_t *size)
{
    size_t n = bench_rand_log_size(state, lo, hi, octaves);
    if (n < min)
        n = min;
    void *p = bench_check(malloc(n), "malloc");
    memset(p, 7, n);
    *size = n;
    return p;
}
