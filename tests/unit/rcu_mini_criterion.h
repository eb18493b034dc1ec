/*
 * The subset of Criterion that test_rcu.c uses, for ThreadSanitizer builds:
 * Criterion's runner cannot start under TSan (Snaipe/Criterion#274, "Could
 * not initialize inheritable arena"). Like Criterion, each test runs in its
 * own forked process, so tests start from a fresh engine. Tests only.
 */
#ifndef RCU_MINI_CRITERION_H
#define RCU_MINI_CRITERION_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

struct mini_test {
    const char *name;
    void (*fn)(void);
};
static struct mini_test mini_tests[64];
static int mini_ntests;

#define Test(suite, name, ...) /* options (.timeout) ignored: meson's apply */ \
    static void suite##_##name(void);                                          \
    __attribute__((constructor)) static void reg_##suite##_##name(void)        \
    {                                                                          \
        mini_tests[mini_ntests++] = (struct mini_test){#suite "::" #name,      \
                                                       suite##_##name};        \
    }                                                                          \
    static void suite##_##name(void)

#define cr_assert(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                          \
            _exit(1);                                                          \
        }                                                                      \
    } while (0)
#define cr_assert_not(cond, ...) cr_assert(!(cond))
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b))
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b))
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b))
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b))
#define cr_log_info(...) ((void)0)

int main(void)
{
    int failed = 0;
    for (int i = 0; i < mini_ntests; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            mini_tests[i].fn();
            fflush(NULL);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("[%s] %s\n", ok ? "PASS" : "FAIL", mini_tests[i].name);
        failed += !ok;
    }
    printf("%d tests, %d failed\n", mini_ntests, failed);
    return failed != 0;
}

#endif
