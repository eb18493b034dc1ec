/*
 * Helpers shared by the allocator tests (unit and stress): running code in a
 * forked child with its stderr captured, reading the resident set size,
 * content patterns, sleeping. Header-only (static functions) so every test
 * program stays one .c file.
 */
#ifndef GS_TESTS_COMMON_H
#define GS_TESTS_COMMON_H

#include "graceslab.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline void gst_sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

static inline double gst_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* seccomp filters in tests. GST_SECCOMP_PROLOGUE kills the process on a
   foreign system-call ABI (where the numbers would mean other calls), then
   loads the call's number; gst_seccomp_install() applies a filter to the
   calling thread. */
#if defined(__x86_64__)
#define GST_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define GST_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif
#ifdef GST_AUDIT_ARCH
#define GST_SECCOMP_PROLOGUE                                                   \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),  \
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, GST_AUDIT_ARCH, 1, 0),             \
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),                   \
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#else
#define GST_SECCOMP_PROLOGUE                                                   \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#endif

static inline bool gst_seccomp_install(struct sock_filter *f, size_t n)
{
    struct sock_fprog prog = {(unsigned short)n, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return false;
    return syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0;
}

/* What a child run by gst_run_child() did. */
struct gst_child {
    int status;      /* from waitpid */
    char err[4096];  /* everything it wrote to stderr, NUL-terminated */
    size_t err_len;
};

/* Runs fn(arg) in a forked child whose stderr goes to a pipe; the child
   exits 0 if fn returns, and is killed by SIGALRM after 30 s. Returns false
   if fork or pipe failed. */
static inline bool gst_run_child(void (*fn)(void *), void *arg, struct gst_child *out)
{
    int p[2];
    if (pipe(p) != 0)
        return false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        alarm(30);
        fn(arg);
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(p[0], out->err + n, sizeof out->err - 1 - n)) > 0 ||
           (r < 0 && errno == EINTR)) {
        if (r > 0)
            n += (size_t)r;
        if (n == sizeof out->err - 1)
            break;
    }
    out->err[n] = 0;
    out->err_len = n;
    close(p[0]);
    while (waitpid(pid, &out->status, 0) < 0 && errno == EINTR)
        ;
    return true;
}

static inline bool gst_child_aborted(const struct gst_child *c)
{
    return WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGABRT;
}

/* Resident set size of this process in bytes (/proc/self/statm), or 0. */
static inline size_t gst_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long size = 0, resident = 0;
    int got = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    return got == 2 ? resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

/* Same without stdio or malloc: for measurements where the test itself
   must not allocate. */
static inline size_t gst_rss_bytes_raw(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *s = buf;
    while (*s && *s != ' ')
        s++;
    size_t pages = 0;
    for (s++; *s >= '0' && *s <= '9'; s++)
        pages = pages * 10 + (size_t)(*s - '0');
    return pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* Content patterns: a block of n bytes filled from a seed, checked before
   it is freed, so that any overlap or reuse of a live block shows. */
static inline unsigned char gst_pattern_byte(uintptr_t seed, size_t i)
{
    return (unsigned char)((seed * 0x9E3779B1u) >> 7 ^ i * 131u ^ (i >> 8));
}

static inline void gst_fill(void *p, size_t n, uintptr_t seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = gst_pattern_byte(seed, i);
}

/* Index of the first wrong byte, or n if all are right. */
static inline size_t gst_check(const void *p, size_t n, uintptr_t seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != gst_pattern_byte(seed, i))
            return i;
    return n;
}

/* Small deterministic PRNG (xorshift64*), one state per thread. */
static inline uint64_t gst_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Bad-input children that compute the pointer they misuse report it to the
   parent through a pipe: the child calls gst_child_report_ptr(p) before the
   bad call, the parent runs it with gst_run_child_ptr(). */
static int gst_ptr_fd __attribute__((unused)) = -1;

static inline void gst_child_report_ptr(const void *p)
{
    ssize_t ignored = write(gst_ptr_fd, &p, sizeof p);
    (void)ignored;
}

static inline bool gst_run_child_ptr(void (*fn)(void *), void *arg, struct gst_child *out,
                                     void **ptr)
{
    int p[2];
    *ptr = NULL;
    if (pipe(p) != 0)
        return false;
    gst_ptr_fd = p[1];
    bool ok = gst_run_child(fn, arg, out);
    close(p[1]);
    gst_ptr_fd = -1;
    if (ok && read(p[0], ptr, sizeof *ptr) != (ssize_t)sizeof *ptr)
        *ptr = NULL;
    close(p[0]);
    return ok;
}

/* The bad-input policy: the child died of SIGABRT after writing exactly one
   line, "graceslab: CALL(): ..." for one of `calls` (NULL-terminated), that
   names ptr as a whole hex word (unless ptr is NULL). Returns true if so;
   otherwise false with the reason in why. */
static inline bool gst_fatal_line_ok(const struct gst_child *c, const char *const *calls,
                                     const void *ptr, char *why, size_t why_len)
{
    if (!gst_child_aborted(c)) {
        snprintf(why, why_len, "no SIGABRT (status %#x); stderr: \"%s\"", c->status, c->err);
        return false;
    }
    bool prefix = false;
    for (int i = 0; calls[i] && !prefix; i++) {
        char want[64];
        snprintf(want, sizeof want, "graceslab: %s(): ", calls[i]);
        prefix = strncmp(c->err, want, strlen(want)) == 0;
    }
    if (!prefix) {
        snprintf(why, why_len, "stderr does not start with \"graceslab: %s(): \": \"%s\"",
                 calls[0], c->err);
        return false;
    }
    if (!c->err_len || strchr(c->err, '\n') != c->err + c->err_len - 1) {
        snprintf(why, why_len, "not exactly one line: \"%s\"", c->err);
        return false;
    }
    if (ptr) {
        char hex[32];
        snprintf(hex, sizeof hex, "%#lx", (unsigned long)(uintptr_t)ptr);
        const char *at = strstr(c->err, hex);
        char after = at ? at[strlen(hex)] : 0;
        if (!at || (after >= '0' && after <= '9') || (after >= 'a' && after <= 'f')) {
            snprintf(why, why_len, "pointer %s not named: \"%s\"", hex, c->err);
            return false;
        }
    }
    return true;
}

#ifdef CRITERION_H_
/* fn, run in a child, reports the pointer it misuses (gst_child_report_ptr)
   and must then abort by the bad-input policy, naming `call`, and saying
   `what` if that is not NULL. */
static inline void gst_assert_child_fatal(void (*fn)(void *), const char *call,
                                          const char *what)
{
    struct gst_child c;
    void *ptr;
    char why[4300];
    const char *calls[] = {call, NULL};
    cr_assert(gst_run_child_ptr(fn, NULL, &c, &ptr), "fork failed");
    cr_assert_not_null(ptr, "child did not report its pointer; stderr: \"%s\"", c.err);
    cr_assert(gst_fatal_line_ok(&c, calls, ptr, why, sizeof why), "%s", why);
    if (what)
        cr_assert(strstr(c.err, what), "\"%s\" lacks \"%s\"", c.err, what);
}
#endif

/* ------------------------------------------------ checks in children */

/* Failure report usable in a child that must not allocate (or may have no
   memory left): format on the stack, write(2), exit 1. */
static inline __attribute__((format(printf, 1, 2), unused)) _Noreturn void
gst_child_fail(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, buf, (size_t)n);
    (void)ignored;
    _exit(1);
}

/* In a child (no Criterion there): report the line and condition, exit 1. */
#define GST_CHILD_CHECK(cond, fmt, ...)                                        \
    do {                                                                       \
        if (!(cond))                                                           \
            gst_child_fail("line %d: %s: " fmt, __LINE__, #cond, ##__VA_ARGS__); \
    } while (0)

/* In the Criterion test (a macro, so that the file including this header
   may include Criterion after it): the child exited 0. */
#define GST_ASSERT_CHILD_OK(c, what)                                           \
    cr_assert(WIFEXITED((c)->status) && WEXITSTATUS((c)->status) == 0,         \
              "%s: child %s %d; stderr:\n%s", (what),                          \
              WIFEXITED((c)->status) ? "exited with" : "killed by signal",     \
              WIFEXITED((c)->status) ? WEXITSTATUS((c)->status)                \
                                     : WTERMSIG((c)->status),                  \
              (c)->err)

/* An array of n pointers outside the allocator under test (direct mmap),
   for children that fill memory. NULL if the mapping failed. */
static inline void **gst_raw_array(size_t n)
{
    void *p = mmap(NULL, n * sizeof(void *), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Re-executing the test program with allocator options in its environment
   (options are read once, at the first allocation, long before a Criterion
   test starts): run gst_exec_self in a child (gst_run_child); the new image
   finds `var`=`mode` in its environment and runs that scenario from a
   constructor instead of reaching Criterion's main. */
struct gst_exec_args {
    const char *var;    /* e.g. "GS_PENDING_CHILD" */
    const char *mode;   /* the scenario */
    const char *env[4]; /* "NAME=value", NULL-terminated */
};

static inline void gst_exec_self(void *arg)
{
    struct gst_exec_args *a = arg;
    setenv(a->var, a->mode, 1);
    for (int i = 0; a->env[i]; i++)
        putenv((char *)a->env[i]);
    char *argv[] = {(char *)"gs_test_child", NULL};
    execv("/proc/self/exe", argv);
    gst_child_fail("execv: %s", strerror(errno));
}

/* ------------------------------------------ a reader held open on purpose */

/* A thread inside a read-side critical section until released: grace
   periods cannot end meanwhile. */
struct gst_held_reader {
    pthread_t thread;
    _Atomic int inside, release;
};

static void *gst_held_reader_main(void *arg)
{
    struct gst_held_reader *r = arg;
    gs_rcu_read_lock();
    atomic_store(&r->inside, 1);
    while (!atomic_load(&r->release))
        gst_sleep_ms(1);
    gs_rcu_read_unlock();
    return NULL;
}

/* Returns once the reader is inside (false if no thread could start). */
static inline bool gst_reader_hold(struct gst_held_reader *r)
{
    atomic_store(&r->inside, 0);
    atomic_store(&r->release, 0);
    if (pthread_create(&r->thread, NULL, gst_held_reader_main, r))
        return false;
    while (!atomic_load(&r->inside))
        gst_sleep_ms(1);
    return true;
}

static inline void gst_reader_release(struct gst_held_reader *r)
{
    atomic_store(&r->release, 1);
    pthread_join(r->thread, NULL);
}

/* A thread that runs gs_synchronize_rcu() once and flags completion. */
struct gst_syncer {
    pthread_t t;
    atomic_int done;
};

static void *gst_syncer_main(void *arg)
{
    struct gst_syncer *s = arg;
    gs_synchronize_rcu();
    atomic_store(&s->done, 1);
    return NULL;
}

/* False if no thread could start. */
static inline bool gst_syncer_start(struct gst_syncer *s)
{
    atomic_init(&s->done, 0);
    return pthread_create(&s->t, NULL, gst_syncer_main, s) == 0;
}

#endif /* GS_TESTS_COMMON_H */
