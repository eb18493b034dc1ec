/*
 * fork() from a signal handler in a process that never started a thread,
 * while the program mallocs and frees blocks of every size up to 70 000
 * bytes (small classes and large blocks). glibc makes fork async-signal-safe
 * with respect to malloc in that case (its own malloc takes no lock in the
 * fork of a single-threaded process; glibc tests it in tst-mallocfork2), so
 * a drop-in malloc must too: graceslab's fork handlers used to take the
 * allocator's locks, and a handler that interrupted a slab being formatted
 * under the segment lock waited for that lock forever (the first few
 * forks, every run).
 *
 * Half the children _exit at once, as a handler's child usually does; the
 * other half return from the handler, finish the malloc or free the signal
 * interrupted, and go on allocating and freeing, checking every block's
 * contents: the child of a fork in the middle of an allocator operation
 * must be able to use the allocator once the operation completes.
 * A plain program (a Criterion worker may have threads): exit status 0 =
 * pass; a hang ends in SIGALRM's message.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/single_threaded.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOTS 1009
#define MAX_SIZE 70000
#define FORKS 200
#define CHILD_ROUNDS 3000

static void *block[SLOTS];
static size_t block_size[SLOTS];
static volatile sig_atomic_t forks, in_child, failed;

static void say(const char *msg)
{
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
}

static void on_tick(int sig)
{
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0) {
        if (forks % 2 == 0)
            _exit(0);
        in_child = 1; /* back to the interrupted call, then main's child loop */
        errno = saved;
        return;
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        say("fork_in_signal_handler: fork or waitpid failed\n");
        _exit(1);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        failed = status;
    forks++;
    errno = saved;
}

static void on_hang(int sig)
{
    (void)sig;
    say("fork_in_signal_handler: hung (a fork handler waited for a lock)\n");
    _exit(2);
}

/* The first and last bytes of a block name its slot and size. */
static void fill(unsigned slot)
{
    unsigned char *p = block[slot];
    size_t n = block_size[slot];
    if (!n)
        return;
    p[0] = (unsigned char)slot;
    if (n > 1)
        p[n - 1] = (unsigned char)(n ^ slot);
}

static int intact(unsigned slot)
{
    unsigned char *p = block[slot];
    size_t n = block_size[slot];
    return !p || !n ||
           (p[0] == (unsigned char)slot && (n == 1 || p[n - 1] == (unsigned char)(n ^ slot)));
}

/* Replaces one random block; 0 if a block came back damaged or NULL. */
static int step(unsigned *seed)
{
    unsigned slot = (unsigned)rand_r(seed) % SLOTS;
    size_t n = (size_t)rand_r(seed) % MAX_SIZE;
    if (!intact(slot))
        return 0;
    free(block[slot]);
    block[slot] = NULL;
    block[slot] = malloc(n);
    block_size[slot] = n;
    if (!block[slot])
        return 0;
    fill(slot);
    return 1;
}

int main(void)
{
    if (!__libc_single_threaded) {
        fprintf(stderr, "fork_in_signal_handler: the process has threads at start\n");
        return 1;
    }
    signal(SIGALRM, on_hang);
    alarm(180);
    struct sigaction sa = {.sa_handler = on_tick};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGVTALRM, &sa, NULL);
    /* Every 300 us of the process's own CPU time: the ticks land wherever
       it spends it, the allocator included. */
    struct itimerval tick = {{0, 300}, {0, 300}};
    setitimer(ITIMER_VIRTUAL, &tick, NULL);
    unsigned seed = 1;
    unsigned long steps = 0;
    while (forks < FORKS && !failed) {
        if (!step(&seed)) {
            say("fork_in_signal_handler: a block was damaged or malloc failed\n");
            return 1;
        }
        steps++;
        if (in_child) {
            /* The timer is not inherited: no more ticks here. */
            for (int i = 0; i < CHILD_ROUNDS; i++)
                if (!step(&seed))
                    _exit(3);
            for (unsigned s = 0; s < SLOTS; s++) {
                if (!intact(s))
                    _exit(3);
                free(block[s]);
            }
            _exit(0);
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_VIRTUAL, &off, NULL);
    if (failed) {
        fprintf(stderr, "fork_in_signal_handler: a child failed (fork %d, wait status %#x)\n", (int)forks, (unsigned)failed);
        return 1;
    }
    for (unsigned s = 0; s < SLOTS; s++) {
        if (!intact(s)) {
            fprintf(stderr, "fork_in_signal_handler: block %u damaged\n", s);
            return 1;
        }
        free(block[s]);
    }
    printf("fork_in_signal_handler: %d forks from a signal handler in %lu mallocs\n",
           (int)forks, steps);
    return 0;
}
