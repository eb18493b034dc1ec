/*
 * Helpers shared by the malloc benchmark programs in bench/: argument
 * parsing, clocks, a cheap PRNG, RSS readings and the RESULT line.
 *
 * Every program takes key=value arguments (seconds=0.5 threads=4 size=64;
 * numbers accept K/M/G suffixes, powers of 1024) and prints exactly one line
 *
 *   RESULT name=<bench> <key>=<value> ... ops=<n> secs=<s> ops_per_sec=<r>
 *          cpu_secs=<user+sys of the process (since bench_cpu_mark(), if
 *          called)> peak_rss_kb=<kb>
 *
 * on stdout, which bench/run parses. The programs call only the standard
 * malloc family, so one binary runs under every allocator via LD_PRELOAD.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Keeps the compiler from eliding a malloc/free pair or a store: p is
   assumed to be read and memory clobbered. Costs no instruction. */
static inline void bench_escape(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* Monotonic time in seconds. */
double bench_now(void);

/* Value of key=value in argv (strtod, with K/M/G suffixes), or def. */
double bench_arg(int argc, char **argv, const char *key, double def);

/* xorshift64*: deterministic per seed, a few instructions per draw. */
static inline uint64_t bench_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [lo, hi]. */
static inline size_t bench_rand_range(uint64_t *state, size_t lo, size_t hi)
{
    return lo + (size_t)(bench_rand(state) % (hi - lo + 1));
}

/* Sizes about log-uniform in [lo, hi]: a doubling lo << k, each k in
   0..octaves as likely (octaves: the whole doublings from lo to hi,
   bench_octaves), then uniform within it; capped at hi. */
unsigned bench_octaves(size_t lo, size_t hi);
size_t bench_rand_log_size(uint64_t *state, size_t lo, size_t hi, unsigned octaves);
/* A block of such a size, at least min bytes, every byte written; its
   size in *size. Aborts if malloc fails. */
void *bench_alloc_log_written(uint64_t *state, size_t lo, size_t hi, unsigned octaves, size_t min,
                              size_t *size);

/* Peak resident set (getrusage ru_maxrss) and current resident set
   (/proc/self/statm), in KiB. */
long bench_peak_rss_kb(void);
long bench_rss_kb(void);

/* Aborts with a message when p is NULL (allocation failure in a benchmark
   is an error, not a result). */
void *bench_check(void *p, const char *what);

/* Prints the RESULT line. extra is a preformatted " key=value ..." string
   (may be empty) placed after name=. */
void bench_result(const char *name, const char *extra, double ops, double secs);

/* Marks the start of the measured part: cpu_secs in the RESULT line then
   counts from here (set-up before it, such as filling a working set, is
   left out). */
void bench_cpu_mark(void);

/* Multi-threaded benchmarks. Each thread gets its own argument block, one
   cache line aligned, whose first member is a struct bench_thread: the
   thread stores the operations it did there. */
struct bench_thread {
    double ops;
};
extern atomic_int bench_stop;
static inline int bench_stopped(void)
{
    return atomic_load_explicit(&bench_stop, memory_order_relaxed);
}
/* n zeroed argument blocks of size bytes each (size a multiple of 64). */
void *bench_thread_args(int n, size_t size);
/* Runs fn(&args[i]) on n threads, sets bench_stop after `seconds`, joins.
   Returns the wall time; *ops gets the sum of the threads' counts. */
double bench_run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size,
                         double seconds, double *ops);

/* The inner loop of the thread benchmarks: up to `steps` times (until
   bench_stopped() when steps < 0), free a random slot of slot[0..n) and
   put a new block of random size lo..hi there, writing its first word.
   slot[] entries must be valid or NULL. Returns the replacements done. */
long bench_replace_slots(void **slot, size_t n, uint64_t *rng, size_t lo, size_t hi,
                         long steps);

#endif /* BENCH_COMMON_H */
