/*
 * Large blocks (alloc/large.c): header lookup from any interior pointer
 * (including the far walk in huge blocks), alignment, the bounded cache,
 * realloc by mremap, accounting. Linked with the static archive.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"
#include "graceslab.h"
#include "../common.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void init(void)
{
    gsi_large_trim(true); /* start each test with an empty cache */
}

TestSuite(large, .init = init);

Test(large, header_found_from_interior_pointers)
{
    static const size_t sizes[] = {GS_SMALL_MAX + 1, 300000, 1 << 20, (4 << 20) + 1,
                                   (9 << 20) + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t size = sizes[i];
        char *p = malloc(size);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 16, 0);
        cr_assert_geq(gsi_map_kind((uintptr_t)p), GS_MAP_LARGE, "size %zu not large", size);
        struct gs_large *b = gsi_large_of(p);
        cr_assert_not_null(b);
        cr_assert_eq((uintptr_t)b & GS_SEGMENT_MASK, 0, "block not 4 MiB aligned");
        cr_assert_eq(b->magic, GS_LARGE_MAGIC);
        cr_assert_eq(b->user, p);
        cr_assert_geq(b->usable, size);
        cr_assert_eq(b->map_len % GS_PAGE, 0);
        cr_assert_leq((char *)p + b->usable, (char *)b + b->map_len);
        cr_assert_eq(gs_usable_size(p), b->usable);
        for (size_t off = 0; off < size; off += 65536 + 7)
            cr_assert_eq(gsi_large_of(p + off), b, "size %zu: +%zu not found", size, off);
        cr_assert_eq(gsi_large_of(p + size - 1), b);
        cr_assert_eq(gsi_large_of((char *)b + b->map_len), NULL, "past the end resolves");
        p[0] = 1;
        p[size - 1] = 2;
        free(p);
    }
}

/* A block above 1 GiB spans more than GS_MAP_FAR 4 MiB units: pointers far
   inside it need the walk back. */
Test(large, huge_block_far_lookup)
{
    size_t size = (size_t)1536 << 20;
    char *p = malloc(size);
    cr_assert_not_null(p);
    struct gs_large *b = gsi_large_of(p);
    cr_assert_not_null(b);
    cr_assert_eq(b->user, p);
    for (size_t off = 0; off < size; off += (size_t)37 << 20)
        cr_assert_eq(gsi_large_of(p + off), b, "+%zu MiB not found", off >> 20);
    cr_assert_eq(gsi_large_of(p + size - 1), b);
    p[size - 1] = 1;
    free(p);
    /* Far above the cache limit: unmapped at once, the map forgets it. */
    cr_assert_eq(gsi_map_kind((uintptr_t)p), 0);
    cr_assert_eq(gsi_map_kind((uintptr_t)p + size - 1), 0);
}

Test(large, alignment_beyond_classes)
{
    for (size_t align = 2 * GS_SLOT_SIZE; align <= ((size_t)64 << 20); align *= 4) {
        char *p = aligned_alloc(align, 100);
        cr_assert_not_null(p, "align %zu", align);
        cr_assert_eq((uintptr_t)p % align, 0, "align %zu: %p", align, p);
        struct gs_large *b = gsi_large_of(p);
        cr_assert_not_null(b);
        cr_assert_eq(b->user, p);
        cr_assert_geq(gs_usable_size(p), 100);
        free(p);
    }
}

/* Freed blocks are cached (bounded) and reused; trimming unmaps them. */
Test(large, cache_reuse_bounded_and_trimmed)
{
    enum { N = 40 };
    void *p[N];
    void *a = malloc(1 << 20);
    struct gs_large *b = gsi_large_of(a);
    free(a);
    cr_assert_eq(gsi_large_cached_bytes(), b->map_len, "freed block not cached");
    void *again = malloc(1 << 20);
    cr_assert_eq(gsi_large_of(again), b, "cached block not reused");
    cr_assert_eq(gsi_large_cached_bytes(), 0);
    free(again);
    for (int i = 0; i < N; i++)
        p[i] = malloc(1 << 20);
    for (int i = 0; i < N; i++)
        free(p[i]);
    /* At most 16 entries and GRACESLAB_LARGE_CACHE_MB (64 MiB). */
    cr_assert_leq(gsi_large_cached_bytes(), 16 * ((1 << 20) + GS_PAGE),
                  "cache holds %zu bytes", gsi_large_cached_bytes());
    struct gs_stats st0, st1;
    gs_stats_get(&st0);
    size_t trimmed = gsi_large_trim(true);
    gs_stats_get(&st1);
    cr_assert_gt(trimmed, 0);
    cr_assert_eq(gsi_large_cached_bytes(), 0);
    cr_assert_eq(st0.mapped_bytes - st1.mapped_bytes, trimmed);
}

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static void touch_pages(char *p, size_t n)
{
    for (size_t i = 0; i < n; i += GS_PAGE)
        p[i] = 1;
}

/* A cached block much longer than the request keeps its excess mapped
   (slack, within the cache budget): alternating small and big requests
   reuse one mapping without faulting pages in again. */
Test(large, long_cached_block_reused_without_refaults)
{
    size_t big = 24 << 20, small = 6 << 20;
    char *p = malloc(big);
    struct gs_large *b = gsi_large_of(p);
    size_t map_len = b->map_len;
    touch_pages(p, big);
    free(p);
    char *q = malloc(small);
    cr_assert_eq(gsi_large_of(q), b, "the cached block was not reused");
    cr_assert_eq(b->map_len, map_len, "the cached block was shrunk");
    cr_assert_geq(b->usable, small);
    cr_assert_lt(b->usable, small + GS_PAGE, "slack counted as usable");
    cr_assert_eq(gsi_large_cached_bytes(), map_len - (b->usable + (size_t)(q - (char *)b)),
                 "slack not accounted");
    touch_pages(q, small);
    free(q);
    long f0 = minor_faults();
    char *r = malloc(big);
    touch_pages(r, big);
    long faults = minor_faults() - f0;
    cr_assert_eq(gsi_large_of(r), b);
    cr_assert_lt(faults, 64, "%ld page faults re-growing a block whose pages were kept", faults);
    free(r);
    cr_assert_eq(gsi_large_cached_bytes(), map_len);
}

/* Slack of live blocks and the cache together stay within
   GRACESLAB_LARGE_CACHE_MB; realloc and free give the slack back. */
Test(large, slack_bounded_by_the_cache_budget)
{
    /* 21 MiB: the cache's 8 MiB block (plus its header page) and the
       slack of two earlier blocks must fit together for the third block
       to find it (the cache is bounded together with the slack). */
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 21);
    size_t big = 8 << 20, small = 2 << 20;
    char *x[4];
    for (int i = 0; i < 4; i++) {
        free(malloc(big)); /* one 8 MiB block in the cache */
        x[i] = malloc(small);
    }
    /* 6 MiB of slack each: three fit in 21 MiB; for the fourth, the
       freed block does not even stay in the cache. */
    for (int i = 0; i < 3; i++)
        cr_assert_geq(gsi_large_of(x[i])->map_len, big, "block %d lost its slack", i);
    cr_assert_lt(gsi_large_of(x[3])->map_len, small + 2 * GS_PAGE,
                 "slack beyond the budget: %zu bytes mapped", gsi_large_of(x[3])->map_len);
    cr_assert_leq(gsi_large_cached_bytes(), (size_t)21 << 20);
    /* realloc up to the mapping's length uses the slack, then it is gone. */
    struct gs_large *b0 = gsi_large_of(x[0]);
    size_t room = b0->map_len - (size_t)(x[0] - (char *)b0);
    x[0] = realloc(x[0], room);
    cr_assert_eq(gsi_large_of(x[0]), b0, "grown within its own mapping, not moved");
    cr_assert_eq(b0->usable, room);
    x[1] = realloc(x[1], 3 << 20); /* shrinks the mapping: its slack goes */
    for (int i = 0; i < 4; i++)
        free(x[i]);
    gsi_large_trim(true);
    cr_assert_eq(gsi_large_cached_bytes(), 0, "slack accounting left %zu bytes",
                 gsi_large_cached_bytes());
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 64);
}

/* The budget of cache and slack is the larger of GRACESLAB_LARGE_CACHE_MB
   and the live large blocks' bytes. Option 9 MiB: a 3 MiB block freed into
   the cache and reused for a 1 MiB request keeps 2 MiB of slack. With
   30 MiB of other blocks live, all four such blocks keep it; with nothing
   else live, three do, and the fourth 3 MiB block does not even stay in
   the cache beside 6 MiB of slack. */
Test(large, slack_budget_grows_with_live_blocks)
{
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 9);
    size_t big = 3 << 20, small = 1 << 20;
    char *held[10], *x[4];
    for (int i = 0; i < 10; i++)
        held[i] = malloc(big);
    for (int i = 0; i < 4; i++) {
        free(malloc(big));
        x[i] = malloc(small);
        cr_assert_geq(gsi_large_of(x[i])->map_len, big,
                      "block %d lost its slack with 30 MiB live", i);
    }
    for (int i = 0; i < 4; i++)
        free(x[i]);
    for (int i = 0; i < 10; i++)
        free(held[i]);
    gsi_large_trim(true);
    for (int i = 0; i < 4; i++) {
        free(malloc(big));
        x[i] = malloc(small);
    }
    cr_assert_geq(gsi_large_of(x[2])->map_len, big, "slack within the 9 MiB option lost");
    cr_assert_lt(gsi_large_of(x[3])->map_len, small + 2 * GS_PAGE,
                 "slack beyond the option with nothing else live: %zu bytes mapped",
                 gsi_large_of(x[3])->map_len);
    for (int i = 0; i < 4; i++)
        free(x[i]);
    gsi_large_trim(true);
    cr_assert_eq(gsi_large_cached_bytes(), 0);
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 64);
}

/* Blocks freed into a cache while live blocks hold slack: the cache
   drops its oldest blocks until cache and slack fit the budget together
   (it used to bound the cache alone: 120 MiB unused for a 64 MiB budget). */
Test(large, cache_fills_only_what_slack_leaves)
{
    size_t limit = (size_t)gsi_option(GSI_OPT_LARGE_CACHE_MB) << 20; /* 64 MiB */
    char *a = malloc(31 << 20), *b = malloc(31 << 20);
    free(a);
    free(b);
    char *s1 = malloc(1 << 20), *s2 = malloc(1 << 20); /* 30 MiB of slack each */
    cr_assert_geq(gsi_large_of(s1)->map_len, (size_t)31 << 20, "no slack kept: test is moot");
    char *c[3];
    for (int i = 0; i < 3; i++)
        c[i] = malloc(20 << 20);
    for (int i = 0; i < 3; i++)
        free(c[i]);
    cr_assert_leq(gsi_large_cached_bytes(), limit, "cache + slack %zu MiB, budget %zu MiB",
                  gsi_large_cached_bytes() >> 20, limit >> 20);
    free(s1);
    free(s2);
}

/* A block above half the cache limit is unmapped at free. */
Test(large, big_blocks_unmapped_at_free)
{
    struct gs_stats st0, st1, st2;
    gs_stats_get(&st0);
    char *p = malloc(40 << 20);
    gs_stats_get(&st1);
    cr_assert_geq(st1.mapped_bytes - st0.mapped_bytes, (size_t)40 << 20);
    cr_assert_geq(st1.large_bytes - st0.large_bytes, (size_t)40 << 20);
    free(p);
    gs_stats_get(&st2);
    cr_assert_eq(st2.mapped_bytes, st0.mapped_bytes);
    cr_assert_eq(st2.large_bytes, st0.large_bytes);
    cr_assert_eq(gsi_large_cached_bytes(), 0);
}

/* realloc of large blocks: grow (in place or moved by mremap) and shrink
   keep the contents and the map consistent. */
Test(large, realloc_keeps_contents_and_map)
{
    size_t size = 300000;
    char *p = malloc(size);
    gst_fill(p, size, 42);
    char *blocker = malloc(300000); /* often right after p: forces a move */
    for (size_t next = size * 3; next < ((size_t)64 << 20); next *= 3) {
        char *q = realloc(p, next);
        cr_assert_not_null(q);
        cr_assert_eq(gst_check(q, size, 42), size, "grow to %zu lost contents", next);
        struct gs_large *b = gsi_large_of(q);
        cr_assert_not_null(b);
        cr_assert_eq(b->user, q);
        cr_assert_geq(b->usable, next);
        cr_assert_eq(gsi_large_of(q + next - 1), b);
        if (q != p && (((uintptr_t)p ^ (uintptr_t)q) >> GS_SEGMENT_SHIFT))
            cr_assert_null(gsi_large_of(p), "old place of a moved block still mapped");
        memset(q + size, 0x5a, next - size);
        gst_fill(q, size, 42);
        p = q;
    }
    char *q = realloc(p, size);
    cr_assert_not_null(q);
    cr_assert_eq(gst_check(q, size, 42), size, "shrink lost contents");
    struct gs_large *b = gsi_large_of(q);
    cr_assert_leq(b->map_len, size + 2 * GS_PAGE + 64, "shrink kept %zu bytes", b->map_len);
    free(q);
    free(blocker);
}

/* Shrinking a large block to a small size moves it into a slab. */
Test(large, realloc_to_small)
{
    char *p = malloc(300000);
    gst_fill(p, 100, 7);
    char *q = realloc(p, 100);
    cr_assert_not_null(q);
    cr_assert_eq(gsi_map_kind((uintptr_t)q), GS_MAP_SMALL);
    cr_assert_eq(gst_check(q, 100, 7), 100);
    free(q);
}

/* Every mremap of the library (linked in: this definition is the one it
   calls) goes through here. While `watch` is set, a shrink in place
   records whether the map units wholly inside the tail it gives back were
   already clear: from the moment the tail is unmapped another thread may
   map a segment or block there and set those units, so clearing them
   after would erase that mapping's entries (an oversubscribed real-program
   sweep hit it: the new block's free aborted as an invalid pointer). */
static bool watch;
static int shrinks, shrinks_with_tail_set;

void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
    void *fixed = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        fixed = va_arg(ap, void *);
        va_end(ap);
    }
    if (watch && !(flags & MREMAP_FIXED) && new_len < old_len) {
        shrinks++;
        uintptr_t tail = ((uintptr_t)old + new_len + GS_SEGMENT_MASK) & ~GS_SEGMENT_MASK;
        for (uintptr_t a = tail; a < (uintptr_t)old + old_len; a += GS_SEGMENT_SIZE)
            if (gsi_map_kind(a) != 0) {
                shrinks_with_tail_set++;
                break;
            }
    }
    return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, fixed);
}

Test(large, tail_unmapped_only_after_its_map_units_cleared)
{
    /* A cached 5 MiB block resized in place for a 300 KiB request: two
       live blocks already keep about 5 MiB of slack each, within a 16 MiB
       budget that also holds the cached block; the budget then drops to
       12 MiB, so it cannot keep its own. */
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 16);
    void *holder[2];
    for (int i = 0; i < 2; i++) {
        free(malloc(5 << 20));
        holder[i] = malloc(300 << 10);
        cr_assert_geq(gsi_large_of(holder[i])->map_len, (size_t)5 << 20, "no slack kept");
    }
    void *big = malloc(5 << 20);
    cr_assert_not_null(big);
    free(big);
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 12);
    watch = true;
    void *p = malloc(300 << 10);
    cr_assert_eq(gsi_large_of(p), (struct gs_large *)((uintptr_t)big & ~GS_SEGMENT_MASK),
                 "the cached block was not reused");
    /* And a live one shrunk by realloc. */
    void *q = malloc(20 << 20);
    cr_assert_not_null(q);
    void *r = realloc(q, 5 << 20);
    watch = false;
    cr_assert_eq(r, q, "a shrinking realloc moved the block");
    cr_assert_eq(shrinks, 2, "%d shrinks in place seen", shrinks);
    cr_assert_eq(shrinks_with_tail_set, 0,
                 "%d of %d shrinks unmapped a tail whose map units were still set",
                 shrinks_with_tail_set, shrinks);
    /* Everything past the new ends is clear, the blocks are found. */
    cr_assert_eq(gsi_large_of(r), (struct gs_large *)((uintptr_t)r & ~GS_SEGMENT_MASK));
    cr_assert_eq(gsi_map_kind(((uintptr_t)r & ~GS_SEGMENT_MASK) + (8u << 20)), 0);
    free(p);
    free(r);
    free(holder[0]);
    free(holder[1]);
    gsi_option_set(GSI_OPT_LARGE_CACHE_MB, 64);
}

/* madvise (here MADV_DONTFORK, as RDMA registration does), mlock or
   mprotect on part of a block split its mapping; mremap refuses a range of
   several mappings, and realloc used to return NULL. It copies instead. */
Test(large, realloc_of_a_split_mapping)
{
    size_t size = 8 << 20;
    char *p = malloc(size);
    gst_fill(p, size, 9);
    char *mid = (char *)(((uintptr_t)p + (3 << 20)) & ~(uintptr_t)(GS_PAGE - 1));
    cr_assert_eq(madvise(mid, 1 << 20, MADV_DONTFORK), 0);
    errno = 0;
    char *q = realloc(p, 32 << 20);
    cr_assert_not_null(q, "errno %d", errno);
    cr_assert_eq(gst_check(q, size, 9), size, "contents lost");
    cr_assert_geq(malloc_usable_size(q), (size_t)32 << 20);
    free(q);
}

/* A realloc that cannot grow a block in place moves its pages to a new
   reservation with mremap(MREMAP_FIXED); kernels before about 6.17 unmap
   that reservation before they check the source, so when the move fails
   another thread may map something there before graceslab unmaps it.
   When the in-place grow already says the mapping is split (EFAULT), the
   move would fail, so it must not be tried. A seccomp filter traps every
   MREMAP_FIXED call; the handler counts it and fails it with EPERM. The
   control (an unsplit block) shows that the filter sees a move. */
#if defined(__x86_64__)
static volatile sig_atomic_t fixed_moves;
static volatile uintptr_t fixed_move_from[8]; /* the source of each */

static void count_fixed_move(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    if (fixed_moves < 8)
        fixed_move_from[fixed_moves] = (uintptr_t)uc->uc_mcontext.gregs[REG_RDI];
    fixed_moves++;
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
}

static bool moved_with_fixed(const void *block)
{
    for (int i = 0; i < fixed_moves && i < 8; i++)
        if (fixed_move_from[i] == (uintptr_t)block)
            return true;
    return false;
}

static bool trap_fixed_mremap(void)
{
    struct sigaction sa = {.sa_sigaction = count_fixed_move, .sa_flags = SA_SIGINFO};
    if (sigaction(SIGSYS, &sa, NULL) != 0)
        return false;
    struct sock_filter f[] = {
        GST_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mremap, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[3])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MREMAP_FIXED, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return gst_seccomp_install(f, sizeof f / sizeof f[0]);
}

/* An 8 MiB block whose next page is taken, so it cannot grow in place. */
static char *blocked_block(size_t size, int seed)
{
    char *p = malloc(size);
    if (!p)
        gst_child_fail("malloc failed");
    gst_fill(p, size, seed);
    struct gs_large *h = gsi_large_of(p);
    void *after = mmap((char *)h + h->map_len, GS_PAGE, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (after == MAP_FAILED)
        gst_child_fail("mmap after the block failed");
    return p;
}

static void grow_split_block(void *arg)
{
    (void)arg;
    size_t size = 8 << 20;
    char *whole = blocked_block(size, 3);
    char *split = blocked_block(size, 4);
    struct gs_large *whole_h = gsi_large_of(whole), *split_h = gsi_large_of(split);
    char *mid = (char *)(((uintptr_t)split + (3 << 20)) & ~(uintptr_t)(GS_PAGE - 1));
    if (madvise(mid, 1 << 20, MADV_DONTFORK) != 0)
        gst_child_fail("madvise failed");
    if (!trap_fixed_mremap())
        gst_child_fail("seccomp filter not installed");
    char *q = realloc(whole, 32 << 20);
    if (!q || gst_check(q, size, 3) != size)
        gst_child_fail("control: realloc lost the block");
    if (!moved_with_fixed(whole_h))
        gst_child_fail("control: no MREMAP_FIXED move of the whole block seen");
    /* (The copy may reuse the control's old block, now cached, and move
       that one: only moves of the split block count.) */
    char *r = realloc(split, 32 << 20);
    if (!r || gst_check(r, size, 4) != size)
        gst_child_fail("split: realloc lost the block");
    if (moved_with_fixed(split_h))
        gst_child_fail("the split mapping was moved with MREMAP_FIXED");
    free(q);
    free(r);
}

Test(large, split_mapping_is_not_moved_with_mremap_fixed)
{
    struct gst_child c;
    cr_assert(gst_run_child(grow_split_block, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "grow a split block");
}
#endif

/* A shrink whose mremap fails (the mapping must split and the process is
   at vm.max_map_count) keeps the longer mapping: the block must still be
   usable for the size realloc accepted (it used to keep the old, smaller
   usable size). In a child: it fills the map count. */
static void shrink_at_map_limit(void *arg)
{
    (void)arg;
    size_t big = 25 << 20;
    char *b = malloc(big);
    memset(b, 1, big);
    free(b); /* cached */
    char *q = malloc(5 << 20); /* the cached block, its excess as slack */
    struct gs_large *h = gsi_large_of(q);
    if (!h || h->map_len < big)
        gst_child_fail("the cached 25 MiB block was not reused whole");
    /* A page right after the mapping, same protection: the kernel merges
       them, so any shrink must split. */
    void *after = mmap((char *)h + h->map_len, GS_PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (after == MAP_FAILED)
        gst_child_fail("mmap after the block failed");
    enum { MAPS = 70000 };
    char *area = mmap(NULL, (size_t)MAPS * 2 * GS_PAGE, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED)
        gst_child_fail("mmap area failed");
    for (long i = 0; i < MAPS; i++)
        if (mprotect(area + i * 2 * GS_PAGE, GS_PAGE, PROT_READ))
            break;
    char *r = realloc(q, 6 << 20);
    if (!r)
        gst_child_fail("realloc failed");
    if (malloc_usable_size(r) < (6u << 20))
        gst_child_fail("usable %zu below the 6 MiB realloc accepted", malloc_usable_size(r));
    exit(0);
}

Test(large, failed_shrink_keeps_the_size_accepted)
{
    struct gst_child c;
    cr_assert(gst_run_child(shrink_at_map_limit, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "shrink at the map limit");
}

/* A request larger than the address space fails at once: no reclaim, so
   no wait for a grace period that a reader (here one that waits for this
   thread) holds open. */
Test(large, impossible_request_fails_without_waiting, .timeout = 60)
{
    /* A cached block, which a reclaim would also have given back. */
    free(malloc(8 << 20));
    size_t cached = gsi_large_cached_bytes();
    cr_assert_geq(cached, (size_t)8 << 20);
    struct gst_held_reader r;
    cr_assert(gst_reader_hold(&r));
    /* Alignments of 2^62 and 2^63 once wrapped the size checks, reclaimed
       (waiting for this reader: a hang) and emptied the cache. */
    /* (Read through volatile: compilers warn on such constant alignments.) */
    static volatile size_t huge_align[2] = {(size_t)1 << 62, (size_t)1 << 63};
    const size_t a62 = huge_align[0], a63 = huge_align[1];
    void *got[8];
    int err[8], rc_pm;
    void *pm = &rc_pm; /* posix_memalign must leave it untouched */
    errno = 0;
    got[0] = malloc((size_t)1 << 48);
    err[0] = errno;
    errno = 0;
    got[1] = aligned_alloc(a63, 64);
    err[1] = errno;
    errno = 0;
    got[2] = aligned_alloc(a62, 1);
    err[2] = errno;
    errno = 0;
    got[3] = memalign(a63, 64);
    err[3] = errno;
    errno = 0;
    got[4] = memalign(a62 + 1, 64); /* rounded up to 2^63 */
    err[4] = errno;
    errno = 0;
    got[5] = memalign(a63 + 1, 64); /* no power of two that large: EINVAL */
    err[5] = errno;
    errno = 0;
    rc_pm = posix_memalign(&pm, a63, 64);
    got[6] = pm == &rc_pm ? NULL : pm;
    err[6] = rc_pm;
    errno = 0;
    got[7] = valloc((size_t)1 << 50);
    err[7] = errno;
    gst_reader_release(&r);
    static const int want[8] = {ENOMEM, ENOMEM, ENOMEM, ENOMEM, ENOMEM, EINVAL, ENOMEM, ENOMEM};
    for (int i = 0; i < 8; i++) {
        cr_assert_null(got[i], "case %d returned %p", i, got[i]);
        cr_assert_eq(err[i], want[i], "case %d: error %d, expected %d", i, err[i], want[i]);
    }
    cr_assert_eq(gsi_large_cached_bytes(), cached, "a failed request emptied the cache");
}
