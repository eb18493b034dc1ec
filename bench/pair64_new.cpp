/*
 * pair64_new: pair64 with C++'s new and delete of a 64-byte object, for
 * callgrind: what C++ code pays per allocation under each allocator.
 * libstdc++'s operator new calls malloc; jemalloc, tcmalloc and mimalloc
 * replace operator new and delete themselves, graceslab does not
 * (docs/design.md, section 4).
 *   iters=1000000   loop count
 * bench/run reports (Ir(N2) - Ir(N1)) / (N2 - N1), as for pair64. No
 * bench/common.h (C only): the one argument is parsed here.
 */
#include <cstdlib>
#include <cstring>

struct block {
    char bytes[64];
};

int main(int argc, char **argv)
{
    long n = 1000000;
    for (int i = 1; i < argc; i++)
        if (std::strncmp(argv[i], "iters=", 6) == 0)
            n = std::atol(argv[i] + 6);
    for (long i = 0; i < n; i++) {
        block *b = new block;
        __asm__ volatile("" : : "r"(b) : "memory"); /* b escapes: new and delete stay */
        delete b;                                   /* sized delete, as C++14 code calls it */
    }
    return 0;
}
