/*
 * The one-line fatal error. Used for bad pointers and API misuse: the
 * process must stop before the allocator's state is corrupted, and the
 * message must get out even when the heap is broken, so it is assembled in
 * a stack buffer and written with write(2).
 */
#include "alloc/common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t append(char *buf, size_t at, size_t cap, const char *s)
{
    while (*s && at < cap)
        buf[at++] = *s++;
    return at;
}

static size_t append_hex(char *buf, size_t at, size_t cap, uintptr_t v)
{
    char tmp[2 + 2 * sizeof v];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    at = append(buf, at, cap, "0x");
    while (n && at < cap)
        buf[at++] = tmp[--n];
    return at;
}

static _Noreturn void fatal_line(const char *call, const char *what, bool has_ptr,
                                 const void *ptr)
{
    char line[256];
    size_t cap = sizeof line - 1, n = 0;
    n = append(line, n, cap, "graceslab: ");
    n = append(line, n, cap, call);
    n = append(line, n, cap, "(): ");
    n = append(line, n, cap, what);
    if (has_ptr) {
        n = append(line, n, cap, " ");
        n = append_hex(line, n, cap, (uintptr_t)ptr);
    }
    line[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, n);
    (void)ignored;
    abort();
}

void gsi_fatal(const char *call, const char *what, const void *ptr)
{
    fatal_line(call, what, true, ptr);
}

void gsi_fatal_msg(const char *call, const char *what)
{
    fatal_line(call, what, false, NULL);
}
