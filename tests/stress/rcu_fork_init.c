/*
 * Fork while another thread makes the process's first RCU call (the
 * engine's one-time initialisation). The engine used to mark its lazy
 * thread as starting before that initialisation registered its fork
 * handlers; a fork in between left the child marked "starting" with no
 * thread and nothing to reset it: its callbacks never ran and
 * gs_rcu_barrier() hung (in 1 to 10 rounds of 70 here). Each round runs in a
 * fresh child (no RCU call made yet), with a different delay before the
 * fork; the grandchild must finish gs_call_rcu + gs_rcu_barrier.
 * A plain program: exit status 0 = pass.
 */
#include "graceslab.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static struct gs_rcu_head first_head, child_head;
static atomic_int go;

static void callback(struct gs_rcu_head *h) { (void)h; }

static void *first_call(void *arg)
{
    (void)arg;
    while (!atomic_load(&go))
        ;
    gs_call_rcu_hurry(&first_head, callback); /* the process's first RCU call */
    return NULL;
}

static void barrier_hung(int sig)
{
    (void)sig;
    static const char msg[] = "rcu_fork_init: gs_rcu_barrier() hung in the child\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(7);
}

/* One round, in a fresh child: 0 if the grandchild's barrier returned. */
static int round_in_child(long delay)
{
    pthread_t t;
    if (pthread_create(&t, NULL, first_call, NULL))
        return 2;
    atomic_store(&go, 1);
    for (volatile long i = 0; i < delay; i++)
        ;
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, barrier_hung);
        alarm(5);
        gs_call_rcu(&child_head, callback);
        gs_rcu_barrier();
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return 3;
    pthread_join(t, NULL);
    gs_rcu_barrier();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 4;
}

int main(void)
{
    static const long delays[] = {0, 100, 1000, 3000, 10000, 30000, 100000};
    int failed = 0, rounds = 0;
    for (int rep = 0; rep < 30; rep++)
        for (unsigned d = 0; d < sizeof delays / sizeof delays[0]; d++) {
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0)
                _exit(round_in_child(delays[d]));
            int st = 0;
            rounds++;
            if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
                failed++;
        }
    printf("rcu_fork_init: %d of %d rounds failed\n", failed, rounds);
    return failed ? 1 : 0;
}
