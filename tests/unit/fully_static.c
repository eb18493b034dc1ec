/*
 * A fully static program (-static: libgraceslab.a and libc.a): it links
 * (libc.a defines malloc and its extensions in one object, so every name a
 * program may call must be graceslab's too, or the linker pulls glibc's
 * malloc in beside it and fails), its malloc is graceslab's, and threads,
 * fork, stdio, glibc's extensions and dlopen work. Not Criterion: it would
 * need its own static libraries. Exit status 0, or 1 with a line on stderr.
 */
#include "graceslab.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fully_static: %s\n", what);
        failures++;
    }
}

/* Blocks cross threads: each worker frees what the previous one left. */
static void *work(void *arg)
{
    char **left = arg;
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(i % 3000) + 1;
        char *p = malloc(n);
        if (!p)
            return (void *)1;
        memset(p, i & 0xff, n);
        free(left[i % 64]);
        left[i % 64] = p;
    }
    return NULL;
}

int main(void)
{
    struct gs_stats a, b;
    gs_stats_get(&a);
    void *p = malloc(100);
    gs_stats_get(&b);
    check(b.allocated_bytes - a.allocated_bytes == gs_usable_size(p),
          "malloc(100) is not counted by graceslab");
    check(malloc_usable_size(p) == 112, "malloc(100) is not in graceslab's 112-byte class");
    free(p);

    static char *left[64];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        check(pthread_create(&t[i], NULL, work, left) == 0, "pthread_create failed");
        void *r;
        pthread_join(t[i], &r);
        check(r == NULL, "a worker's malloc failed");
    }
    for (int i = 0; i < 64; i++)
        free(left[i]);

    check(mallopt(M_ARENA_MAX, 2) == 1, "mallopt(M_ARENA_MAX, 2) refused");
    check(mallopt(M_MXFAST, 1000) == 0, "mallopt(M_MXFAST, 1000) accepted (glibc refuses it)");
    struct mallinfo2 mi = mallinfo2();
    check(mi.arena >= mi.uordblks, "mallinfo2: arena below the bytes in use");
    malloc_trim(0);
    check(malloc_info(0, stdout) == 0, "malloc_info failed");
    pid_t child = fork();
    if (child == 0) { /* the child of a threaded parent allocates and frees */
        char *c = malloc(5000);
        _exit(c && gs_usable_size(c) >= 5000 ? 0 : 1);
    }
    int status = -1;
    check(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "the fork child could not allocate");
    /* dlopen goes through graceslab's (alloc/dlopen.c) to libc.a's: the
       library loads and its code runs (its own malloc is the shared
       libc's, as it is without graceslab); a missing one fails with a
       message. */
    void *m = dlopen("libm.so.6", RTLD_NOW | RTLD_DEEPBIND);
    check(m != NULL, "dlopen(libm.so.6) failed");
    if (m) {
        double (*cosine)(double);
        *(void **)&cosine = dlsym(m, "cos");
        check(cosine && cosine(0.0) == 1.0, "libm's cos not found or wrong");
        check(dlclose(m) == 0, "dlclose failed");
    }
    check(dlopen("libgraceslab-no-such-library.so", RTLD_NOW) == NULL && dlerror() != NULL,
          "dlopen of a missing library did not fail with a message");

    char *s = strdup("fully static");
    check(s && strcmp(s, "fully static") == 0, "strdup");
    free(s);
    if (failures)
        return 1;
    printf("fully_static: ok\n");
    return 0;
}
