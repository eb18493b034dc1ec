/*
 * The program secure_exec.sh runs twice, once as itself and once as a
 * set-user-ID copy: it reports whether the kernel marked it AT_SECURE and
 * whether a 64 MiB block could be had. Linked with libgraceslab.a, so the
 * copy gets graceslab without LD_PRELOAD or a library path (both of which
 * the loader ignores in a set-user-ID program).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

int main(void)
{
    void *big = malloc((size_t)64 << 20);
    int err = errno;
    printf("secure=%lu big=%s\n", getauxval(AT_SECURE), big ? "ok" : strerror(err));
    free(big);
    return 0;
}
