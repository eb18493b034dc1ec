/*
 * Fork while another thread makes the process's first RCU call (the
 * engine's one-time initialisation). The engine used to mark its lazy
 * thread as starting before that initialisation registered its fork
 * handlers; a fork in between left the child marked "starting" with no
 * thread and nothing to reset it: its callbacks never ran and
 * gs_rcu_barrier() hung (in 1 to 10 rounds of 70 here). Each round runs in a
 * fresh child (no RCU call made yet), with a different delay before the
 * fork; the grandchild must finish gs_call_rcu + gs_rcu_barrier.
 *
 * Second case, first_read_during_fork: the first RCU call is a read lock,
 * in 4 threads that go on reading. The engine registered its fork handlers
 * in that call; glibc runs in a child only the handlers that existed when
 * fork began its prepare phase, so a thread that registered them and then
 * linked its reader record while another thread was forking left the
 * child with that record, no handler to drop it, and a grace period
 * waiting for a reader that does not exist there (1 in 300 such processes
 * hung). The handlers are registered at load time now; the grandchild
 * must finish gs_synchronize_rcu.
 * A plain program: exit status 0 = pass.
 */
#include "graceslab.h"

#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static struct gs_rcu_head first_head, child_head;
static atomic_int go, stop;

static void callback(struct gs_rcu_head *h) { (void)h; }

static void *first_call(void *arg)
{
    (void)arg;
    while (!atomic_load(&go))
        ;
    gs_call_rcu_hurry(&first_head, callback); /* the process's first RCU call */
    return NULL;
}

static void *first_reads(void *arg)
{
    (void)arg;
    while (!atomic_load(&go))
        ;
    while (!atomic_load(&stop)) {
        gs_rcu_read_lock(); /* the first one is the thread's first RCU call */
        for (volatile int i = 0; i < 100; i++)
            ;
        gs_rcu_read_unlock();
    }
    return NULL;
}

static void child_hung(int sig)
{
    (void)sig;
    static const char msg[] = "rcu_fork_init: gs_rcu_barrier() or gs_synchronize_rcu() hung "
                              "in the child\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(7);
}

/* One round, in a fresh child: 0 if the grandchild's barrier (reads:
   its gs_synchronize_rcu) returned. */
static int round_in_child(long delay, bool reads)
{
    enum { READERS = 4 };
    pthread_t t[READERS];
    int n = reads ? READERS : 1;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, reads ? first_reads : first_call, NULL))
            return 2;
    atomic_store(&go, 1);
    for (volatile long i = 0; i < delay; i++)
        ;
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, child_hung);
        alarm(5);
        if (reads) {
            gs_synchronize_rcu();
        } else {
            gs_call_rcu(&child_head, callback);
            gs_rcu_barrier();
        }
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return 3;
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    gs_rcu_barrier();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 4;
}

int main(void)
{
    static const long delays[] = {0, 100, 1000, 3000, 10000, 30000, 100000};
    int total_failed = 0;
    for (int reads = 0; reads < 2; reads++) {
        int failed = 0, rounds = 0;
        for (int rep = 0; rep < (reads ? 90 : 30); rep++)
            for (unsigned d = 0; d < sizeof delays / sizeof delays[0]; d++) {
                fflush(NULL);
                pid_t pid = fork();
                if (pid == 0)
                    _exit(round_in_child(delays[d], reads));
                int st = 0;
                rounds++;
                if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
                    failed++;
            }
        printf("rcu_fork_init: %s: %d of %d rounds failed\n",
               reads ? "first_read_during_fork" : "first_call_during_fork", failed, rounds);
        total_failed += failed;
    }
    return total_failed ? 1 : 0;
}
