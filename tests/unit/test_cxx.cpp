/*
 * The public header from C++: it compiles (with the inlined read side too,
 * GRACESLAB_RCU_INLINE), links against libgraceslab.so, and the calls do
 * what they say. A plain program (exit status 0 = pass), not Criterion:
 * what is tested is the header's C++ face, not the library.
 */
#define GRACESLAB_RCU_INLINE
#include "graceslab.h"

#include <cstdio>
#include <cstring>

static int fail(int line)
{
    std::fprintf(stderr, "test_cxx.cpp:%d: check failed\n", line);
    return 1;
}
#define CHECK(c) do { if (!(c)) return fail(__LINE__); } while (0)

struct node {
    int value;
};

static node *published;
static int callbacks;

static void count_cb(gs_rcu_head *)
{
    __atomic_fetch_add(&callbacks, 1, __ATOMIC_RELEASE);
}

int main()
{
    char *p = static_cast<char *>(gs_malloc(100));
    CHECK(p != nullptr);
    std::memset(p, 0x5a, 100);
    CHECK(gs_usable_size(p) >= 100);
    gs_free(p);

    node *n = static_cast<node *>(gs_malloc(sizeof(node)));
    CHECK(n != nullptr);
    n->value = 7;
    gs_rcu_assign_pointer(published, n);

    gs_rcu_read_lock(); /* the inline version: the macro maps it */
    gs_rcu_read_lock();
    node *seen = gs_rcu_dereference(published);
    CHECK(seen == n && seen->value == 7);
    CHECK(gsi_rcu_self_view_v3.nested == 1 && gsi_rcu_self_view_v3.snap != 0);
    gs_rcu_read_unlock();
    gs_rcu_read_unlock();
    CHECK(gsi_rcu_self_view_v3.nested == 0 && gsi_rcu_self_view_v3.snap == 0);

    gs_rcu_assign_pointer(published, static_cast<node *>(nullptr));
    gs_free_rcu(n);
    static gs_rcu_head head;
    gs_call_rcu(&head, count_cb);
    gs_rcu_barrier();
    CHECK(__atomic_load_n(&callbacks, __ATOMIC_ACQUIRE) == 1);
    gs_synchronize_rcu();
    return 0;
}
