/*
 * Basics shared by alloc/ and rcu/: branch hints, asserts, the fatal-error
 * line, and the option table. Nothing here allocates.
 */
#ifndef GS_COMMON_H
#define GS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GS_LIKELY(x)   __builtin_expect(!!(x), 1)
#define GS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GS_NOINLINE    __attribute__((noinline))
#define GS_COLD        __attribute__((cold, noinline))
#define GS_INLINE      static inline __attribute__((always_inline))
#define GS_EXPORT      __attribute__((visibility("default")))
/* The names only graceslab.h's inlined read side uses (the grace-period
   state, the reader record's public alias, the driver wake-up): exported
   from libgraceslab.so, hidden in libgraceslab.a (built with GS_ARCHIVE),
   where a program or plugin linking the archive reaches them at link
   time. Exported from a copy inside a plugin, they would bind to another
   graceslab's in the process, and the two engines would share one
   sequence with two registries: grace periods ending with readers inside. */
#if defined(GS_ARCHIVE) && GS_ARCHIVE
#define GS_INLINE_ABI  __attribute__((visibility("hidden")))
#else
#define GS_INLINE_ABI  GS_EXPORT
#endif
#define GS_CACHELINE   64

/* ThreadSanitizer, under gcc (__SANITIZE_THREAD__) or clang (which defines
   no macro for it, only __has_feature). */
#if defined(__SANITIZE_THREAD__)
#define GS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GS_TSAN 1
#endif
#endif
#ifndef GS_TSAN
#define GS_TSAN 0
#endif
/* The free fast path's asm (x86_64): not for x32, whose pointers are 32
   bits, nor under ThreadSanitizer, which cannot see a read inside asm. */
#if defined(__x86_64__) && defined(__LP64__) && !GS_TSAN
#define GS_FAST_ASM 1
#else
#define GS_FAST_ASM 0
#endif

#ifndef GS_ASSERT_LEVEL
#define GS_ASSERT_LEVEL 1
#endif

/* Writes "graceslab: <call>(): <what> <ptr>\n" to stderr with write(2) and
   aborts. Never allocates; safe inside the allocator with locks held. */
_Noreturn void gsi_fatal(const char *call, const char *what, const void *ptr);
/* Same line without a pointer. */
_Noreturn void gsi_fatal_msg(const char *call, const char *what);

/* GS_ASSERT: cheap internal invariants (level >= 1), GS_ASSERT_EXPENSIVE:
   fast-path and O(n) checks (level 2). When off, the expression is still
   type-checked but not evaluated. */
#define GS_ASSERT_AT(level, cond)                                              \
    do {                                                                       \
        if (GS_ASSERT_LEVEL >= (level)) {                                      \
            if (GS_UNLIKELY(!(cond)))                                          \
                gsi_fatal_msg("internal", "assertion failed: " #cond           \
                              " at " __FILE__);                                \
        } else {                                                               \
            (void)sizeof(!(cond));                                             \
        }                                                                      \
    } while (0)
#define GS_ASSERT(cond)           GS_ASSERT_AT(1, cond)
#define GS_ASSERT_EXPENSIVE(cond) GS_ASSERT_AT(2, cond)

/* Options, read once from GRACESLAB_* environment variables (see the table
   in options.c and README.md). */
enum gsi_option {
    GSI_OPT_STATS,            /* GRACESLAB_STATS: print a summary at exit */
    GSI_OPT_PURGE_DELAY_MS,   /* GRACESLAB_PURGE_DELAY_MS */
    GSI_OPT_EMPTY_CACHE_MB,   /* GRACESLAB_EMPTY_CACHE_MB */
    GSI_OPT_HEAP_EMPTY_KB,    /* GRACESLAB_HEAP_EMPTY_KB */
    GSI_OPT_HEAP_SHARED_KEEP_MB, /* GRACESLAB_HEAP_SHARED_KEEP_MB */
    GSI_OPT_HEAP_EMPTY_TOTAL_MB, /* GRACESLAB_HEAP_EMPTY_TOTAL_MB */
    GSI_OPT_LARGE_CACHE_MB,   /* GRACESLAB_LARGE_CACHE_MB */
    GSI_OPT_RCU_LAZY_MS,      /* GRACESLAB_RCU_LAZY_MS */
    GSI_OPT_RCU_LAZY_BATCH,   /* GRACESLAB_RCU_LAZY_BATCH */
    GSI_OPT_RCU_FENCES,       /* GRACESLAB_RCU_FENCES: 1 forces the fence read side */
    GSI_OPT_PENDING_EXPEDITE_KB, /* GRACESLAB_PENDING_EXPEDITE_KB */
    GSI_OPT_OS_FAIL_AFTER_MB, /* GRACESLAB_OS_FAIL_AFTER_MB: fault injection */
    GSI_OPT_VALGRIND,         /* GRACESLAB_VALGRIND: 0 disables memcheck requests */
    GSI_OPT_DEEPBIND,         /* GRACESLAB_DEEPBIND: 1 keeps dlopen's RTLD_DEEPBIND */
    GSI_OPT_DECAY_MS,         /* GRACESLAB_DECAY_MS */
    GSI_OPT_COUNT
};
/* Value of an option; the first call parses the environment (no malloc). */
long gsi_option(enum gsi_option opt);
/* Overrides an option (tests of internals). */
void gsi_option_set(enum gsi_option opt, long value);

#endif /* GS_COMMON_H */
