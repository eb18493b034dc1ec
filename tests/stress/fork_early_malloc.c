/*
 * Fork while threads use a dedicated cache and defer frees, in a program
 * where graceslab's first allocation came before its constructor (a
 * library linked after it allocates in its own constructor). The
 * allocator's fork handlers then used to register first and the RCU
 * engine's last, so the engine's prepare handler ran first and took the
 * registry lock while a cache's refill held its cache lock and waited for
 * the registry lock to nudge the grace-period engine; the fork's next
 * prepare handler waited for that cache lock: a deadlock before the first
 * fork completed, every run (found in the thirteenth session's review).
 * The two sets are one triple now, the allocator's locks first.
 * A plain program: exit status 0 = pass; a hang ends in SIGALRM's message.
 */
#include "graceslab.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *gst_early_block; /* early_malloc_lib.c */

static struct gs_cache *cache;
static atomic_int stop;

static void *worker(void *arg)
{
    (void)arg;
    void *v[64];
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 64; i++)
            v[i] = gs_cache_alloc(cache);
        for (int i = 0; i < 64; i++)
            gs_cache_free_rcu(cache, v[i]);
    }
    return NULL;
}

static void hung(int sig)
{
    (void)sig;
    static const char msg[] = "fork_early_malloc: fork hung (fork handler order)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(2);
}

int main(void)
{
    if (!gst_early_block) {
        fprintf(stderr, "fork_early_malloc: the early library did not allocate\n");
        return 1;
    }
    signal(SIGALRM, hung);
    alarm(60);
    cache = gs_cache_create("fork_early", 256, 16, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        if (pthread_create(&t[i], NULL, worker, NULL))
            return 1;
    int forks = 1000, failed = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            failed++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    gs_cache_destroy(cache);
    printf("fork_early_malloc: %d forks, %d failed\n", forks, failed);
    return failed ? 1 : 0;
}
