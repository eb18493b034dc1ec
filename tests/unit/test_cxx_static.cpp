/*
 * A C++ program linked with the static archive that allocates only with
 * new and delete (libstdc++ calls malloc; the program never names it) and
 * calls glibc's malloc_trim and mallinfo2. Those two come from graceslab's
 * glibc_api.o, which must bring graceslab's malloc with it: it used not
 * to, and the program described and trimmed an allocator that held
 * nothing (uordblks 0 with 10 MB live) while glibc's malloc held it all.
 * A plain program (exit status 0 = pass).
 */
#include <cstdio>
#include <malloc.h>

static int fail(int line, unsigned long v)
{
    std::fprintf(stderr, "test_cxx_static.cpp:%d: check failed (%lu)\n", line, v);
    return 1;
}
#define CHECK(c, v) do { if (!(c)) return fail(__LINE__, (unsigned long)(v)); } while (0)

int main()
{
    enum { N = 100000, SIZE = 100 };
    static char *p[N];
    for (int i = 0; i < N; i++)
        p[i] = new char[SIZE];
    struct mallinfo2 mi = mallinfo2();
    CHECK(mi.uordblks >= (size_t)N * SIZE, mi.uordblks);
    for (int i = 0; i < N; i++)
        delete[] p[i];
    mi = mallinfo2();
    CHECK(mi.uordblks < (size_t)N * SIZE / 10, mi.uordblks);
    CHECK(malloc_trim(0) == 1, 0);
    return 0;
}
