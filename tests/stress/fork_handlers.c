/*
 * Fork handlers of another library that allocate, registered before
 * graceslab's (atfork_lib.c: 60 of them, from a constructor that runs
 * before graceslab's, before anything allocated). glibc runs prepare
 * handlers in reverse order of registration and parent/child handlers in
 * order, so graceslab's handlers, had they registered last, took the
 * allocator's locks before those prepare handlers ran and released them
 * after those child handlers ran: the first of them to allocate waited for
 * the lock its own thread held (a hang at the first fork). And the 49th
 * registration made glibc allocate while it held its handler-list lock,
 * and that first allocation's initialisation of graceslab waited for the
 * same lock to register graceslab's handlers (a hang at start-up).
 * graceslab now registers its handlers first, at the first registration
 * by anyone (alloc/atfork.c). Found by a helper going through glibc's
 * malloc tests.
 * Three threads allocate and free while the main thread forks; each child
 * checks the blocks the prepare handlers allocated, allocates itself and
 * exits. A plain program: exit status 0 = pass; a hang ends in SIGALRM's
 * message.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANDLERS 60
#define FORKS 200
#define THREADS 3

extern void *gst_prepare_block[HANDLERS];
extern void *gst_after_block[HANDLERS];
extern int gst_handlers_registered;

static atomic_bool stop;

static void fail(const char *msg)
{
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
    _exit(1);
}

static void hung(int sig)
{
    (void)sig;
    fail("fork_handlers: hung (a fork handler that allocates waited for graceslab's locks)\n");
}

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *v[256] = {0};
    while (!atomic_load(&stop)) {
        unsigned i = (unsigned)rand_r(&seed) % 256;
        free(v[i]);
        v[i] = malloc((size_t)rand_r(&seed) % 50000);
    }
    for (int i = 0; i < 256; i++)
        free(v[i]);
    return NULL;
}

/* Every prepare handler's block: allocated, and its first 100 bytes as
   the handler wrote them. */
static bool prepare_blocks_intact(void)
{
    for (int i = 0; i < HANDLERS; i++) {
        unsigned char *p = gst_prepare_block[i];
        if (!p || p[0] != (unsigned char)i || p[99] != (unsigned char)i)
            return false;
    }
    return true;
}

int main(void)
{
    signal(SIGALRM, hung);
    alarm(120);
    if (gst_handlers_registered != HANDLERS)
        fail("fork_handlers: the library registered too few handlers\n");
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, churn, (void *)(i + 1)) != 0)
            fail("fork_handlers: pthread_create failed\n");
    for (int f = 0; f < FORKS; f++) {
        pid_t pid = fork();
        if (pid < 0)
            fail("fork_handlers: fork failed\n");
        if (pid == 0) {
            if (!prepare_blocks_intact())
                _exit(3);
            for (int i = 0; i < HANDLERS; i++) {
                if (!gst_after_block[i])
                    _exit(4);
                free(gst_after_block[i]);
                free(gst_prepare_block[i]);
            }
            void *p = malloc(123);
            free(p);
            _exit(p ? 0 : 5);
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("fork_handlers: a child failed\n");
        if (!prepare_blocks_intact())
            fail("fork_handlers: a prepare handler's block is wrong in the parent\n");
        for (int i = 0; i < HANDLERS; i++)
            free(gst_prepare_block[i]);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < HANDLERS; i++)
        free(gst_after_block[i]);
    printf("fork_handlers: %d forks with %d allocating handlers of another library\n", FORKS,
           HANDLERS);
    return 0;
}
