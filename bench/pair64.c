/*
 * pair64: the minimal malloc(64)+free loop for callgrind.
 *   iters=1000000   loop count
 * bench/run counts instructions (Ir) for two loop counts and reports
 * (Ir(N2) - Ir(N1)) / (N2 - N1): start-up and exit cancel out, leaving the
 * cost of one pair plus this loop's own few instructions.
 */
#include "common.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    long n = (long)bench_arg(argc, argv, "iters", 1000000);
    for (long i = 0; i < n; i++) {
        void *p = malloc(64);
        bench_escape(p);
        free(p);
    }
    return 0;
}
