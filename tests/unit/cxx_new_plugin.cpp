/*
 * C++ code for test_cxx_new.c, which dlopens it: new and delete as a C++
 * program uses them, behind extern "C" probes that turn what C cannot see
 * (exceptions, handlers) into return values. When the test program does not
 * link libstdc++, this plugin brings it: the C++ runtime arrives after
 * graceslab, as in a C program that loads C++ code.
 */
#include <cstddef>
#include <new>

namespace {
struct alignas(256) aligned_block {
    char bytes[300];
};
struct out_of_luck {};

int handler_calls;
int give_up_after;
char *reserve;

void counting_handler()
{
    if (++handler_calls >= give_up_after)
        std::set_new_handler(nullptr);
}

void throwing_handler()
{
    handler_calls++;
    throw out_of_luck();
}

void releasing_handler()
{
    handler_calls++;
    delete[] reserve;
    reserve = nullptr;
    std::set_new_handler(nullptr);
}
} // namespace

extern "C" {

/* The operator new and delete this code calls (through its GOT). */
void *plugin_new_address()
{
    return reinterpret_cast<void *>(static_cast<void *(*)(std::size_t)>(&::operator new));
}
void *plugin_sized_delete_address()
{
    return reinterpret_cast<void *>(
        static_cast<void (*)(void *, std::size_t)>(&::operator delete));
}

void *plugin_new(std::size_t size)
{
    return new char[size];
}
void plugin_delete(void *p)
{
    delete[] static_cast<char *>(p);
}
void plugin_sized_delete(void *p, std::size_t size)
{
    ::operator delete(p, size);
}
void *plugin_new_aligned_block()
{
    return new aligned_block;
}
void plugin_delete_aligned_block(void *p)
{
    delete static_cast<aligned_block *>(p);
}

/* 1 if new of size bytes (aligned to align, if not 0) threw std::bad_alloc,
   0 if it returned (the block is freed), 2 if it threw anything else. */
int plugin_new_throws_bad_alloc(std::size_t size, std::size_t align)
{
    try {
        void *p = align ? ::operator new(size, std::align_val_t(align)) : ::operator new(size);
        if (align)
            ::operator delete(p, std::align_val_t(align));
        else
            ::operator delete(p);
        return 0;
    } catch (const std::bad_alloc &) {
        return 1;
    } catch (...) {
        return 2;
    }
}

/* new (std::nothrow) of size bytes (aligned to align, if not 0). */
void *plugin_nothrow_new(std::size_t size, std::size_t align)
{
    return align ? ::operator new(size, std::align_val_t(align), std::nothrow)
                 : ::operator new(size, std::nothrow);
}

/* Installs a handler that gives up (uninstalls itself) on its n-th call,
   then asks for size bytes; returns the handler's calls if new threw
   std::bad_alloc, -1 otherwise. */
int plugin_handler_calls_until_bad_alloc(std::size_t size, int n)
{
    handler_calls = 0;
    give_up_after = n;
    std::set_new_handler(counting_handler);
    try {
        ::operator delete(::operator new(size));
    } catch (const std::bad_alloc &) {
        return handler_calls;
    }
    std::set_new_handler(nullptr);
    return -1;
}

/* 1 if the exception the handler throws reaches the caller of new. */
int plugin_handler_exception_reaches_caller(std::size_t size)
{
    handler_calls = 0;
    std::set_new_handler(throwing_handler);
    int got = 0;
    try {
        ::operator delete(::operator new(size));
    } catch (const out_of_luck &) {
        got = handler_calls == 1;
    } catch (...) {
    }
    std::set_new_handler(nullptr);
    return got;
}

/* Holds reserve_size bytes, installs a handler that frees them, and asks
   for size bytes: the handler's calls if new then succeeded, -1 if it
   threw. */
int plugin_handler_frees_reserve(std::size_t reserve_size, std::size_t size)
{
    handler_calls = 0;
    reserve = new char[reserve_size];
    reserve[0] = 1;
    std::set_new_handler(releasing_handler);
    int result = -1;
    try {
        char *p = new char[size];
        p[size - 1] = 1;
        delete[] p;
        result = handler_calls;
    } catch (...) {
    }
    std::set_new_handler(nullptr);
    delete[] reserve;
    reserve = nullptr;
    return result;
}
}
