/*
 * graceslab's address-space footprint: a small program preloading it
 * runs under an RLIMIT_AS of 32 MiB. Its fixed tables take about 9 MiB of
 * address space (the free fast path's map, 8 MiB, and the segment map's
 * top level; its leaves are mapped only where graceslab maps), plus the
 * segments in use. It passes down to 24 MiB. With the 32 MiB fast map of
 * the earlier design the library did not load under 32 MiB ("cannot be
 * preloaded"), nor under 64 MiB with the flat segment map before that.
 *
 * usage: address_space LIBGRACESLAB.so — sets the limit, then re-executes
 * itself with the library preloaded; the child checks that its malloc is
 * graceslab's and allocates 4 MiB. Exit status 0, or 1 with a line on
 * stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define LIMIT ((rlim_t)32 << 20)

static int child(void)
{
    /* The library is loaded and its malloc is the program's. */
    void *(*gs_malloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "gs_malloc");
    if (!gs_malloc) {
        fprintf(stderr, "address_space: graceslab not loaded under a %lu MiB limit\n",
                (unsigned long)(LIMIT >> 20));
        return 1;
    }
    void *p = malloc(100);
    if (!p || malloc_usable_size(p) != 112) {
        fprintf(stderr, "address_space: malloc is not graceslab's\n");
        return 1;
    }
    free(p);
    enum { N = 4096 };
    static char *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(1000);
        if (!blocks[i]) {
            fprintf(stderr, "address_space: malloc failed after %d KB\n", i);
            return 1;
        }
        memset(blocks[i], i, 1000);
    }
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "child") == 0)
        return child();
    if (argc != 2) {
        fprintf(stderr, "usage: address_space LIBGRACESLAB.so\n");
        return 2;
    }
    struct rlimit lim = {LIMIT, LIMIT};
    if (setrlimit(RLIMIT_AS, &lim) != 0 || setenv("LD_PRELOAD", argv[1], 1) != 0) {
        perror("address_space");
        return 1;
    }
    execl("/proc/self/exe", argv[0], "child", (char *)NULL);
    perror("address_space: exec");
    return 1;
}
