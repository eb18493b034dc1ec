/*
 * fork while other threads read long lines with getline (which mallocs
 * while it holds its stream's lock) and flush every stream with
 * fflush(NULL) (which holds glibc's stdio list lock while it waits for each
 * stream's lock): the scenario of glibc's tst-malloc-fork-deadlock. glibc's
 * fork takes the list lock after the pthread_atfork prepare handlers, so a
 * prepare handler that takes the allocator's locks first closes a cycle:
 * fork waits for the list lock, the flush for a stream, and getline's
 * malloc for the allocator's locks that fork holds. graceslab's prepare
 * handler takes the list lock first (alloc/heap.c). Before, this hung
 * within a second, every run (jemalloc and tcmalloc hang here too).
 * The children use stdio and malloc before they exit.
 * A plain program: exit status 0 = pass; a hang ends in SIGALRM's message.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FORKERS 4
#define READERS 8
#define LINE 50000
#define SECONDS 3

static atomic_bool stop;
static atomic_ulong forks, lines;
static char path[64];

static void fail(const char *msg)
{
    ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
    (void)ignored;
    _exit(1);
}

/* Reads the file's one line: 0 if it is not LINE 'x's. */
static int read_line(FILE *f)
{
    char *line = NULL;
    size_t cap = 0;
    rewind(f);
    ssize_t n = getline(&line, &cap, f);
    int ok = n == LINE + 1 && line[0] == 'x' && line[LINE - 1] == 'x';
    free(line);
    return ok;
}

static void child(void)
{
    FILE *f = fopen(path, "r");
    if (!f || !read_line(f))
        _exit(3);
    fclose(f);
    if (fflush(NULL) != 0)
        _exit(4);
    _exit(17);
}

static void *forker(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        pid_t pid = fork();
        if (pid < 0)
            fail("fork_stdio_deadlock: fork failed\n");
        if (pid == 0)
            child();
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 17)
            fail("fork_stdio_deadlock: a child failed\n");
        atomic_fetch_add(&forks, 1);
    }
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    FILE *f = fopen(path, "r");
    if (!f)
        fail("fork_stdio_deadlock: fopen failed\n");
    while (!atomic_load(&stop)) {
        if (!read_line(f))
            fail("fork_stdio_deadlock: getline read a wrong line\n");
        atomic_fetch_add(&lines, 1);
    }
    fclose(f);
    return NULL;
}

static void *flusher(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        if (fflush(NULL) != 0)
            fail("fork_stdio_deadlock: fflush failed\n");
    return NULL;
}

static void hung(int sig)
{
    (void)sig;
    fail("fork_stdio_deadlock: hung (fork handlers against the stdio list lock)\n");
}

int main(void)
{
    signal(SIGALRM, hung);
    alarm(120);
    snprintf(path, sizeof path, "/tmp/gs_fork_stdio_%d", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        fail("fork_stdio_deadlock: cannot create the file\n");
    for (int i = 0; i < LINE; i++)
        fputc('x', f);
    fputc('\n', f);
    fclose(f);

    pthread_t t[FORKERS + READERS + 1];
    int n = 0;
    for (int i = 0; i < FORKERS + READERS + 1; i++, n++)
        if (pthread_create(&t[n], NULL, i < FORKERS ? forker : i < FORKERS + READERS ? reader : flusher,
                           NULL) != 0)
            fail("fork_stdio_deadlock: pthread_create failed\n");
    sleep(SECONDS);
    atomic_store(&stop, true);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    unlink(path);
    printf("fork_stdio_deadlock: %lu forks, %lu lines read in %d s\n", atomic_load(&forks),
           atomic_load(&lines), SECONDS);
    if (!atomic_load(&forks) || !atomic_load(&lines)) {
        fprintf(stderr, "fork_stdio_deadlock: no forks or no lines\n");
        return 1;
    }
    return 0;
}
