/*
 * rcu_torture: in the spirit of the kernel's rcutorture.
 *
 * NSLOTS pointers to objects. Readers, inside gs_rcu_read_lock(), pick
 * slots and validate the object they find (magic, a checksum of its
 * generation, the slot it belongs to); some nest, some linger, some yield
 * inside. Writers replace objects and reclaim the old one in five ways:
 * after gs_synchronize_rcu(), from a gs_call_rcu() or gs_call_rcu_hurry()
 * callback, after gs_rcu_get_state()/gs_rcu_poll_state() turned true, and
 * after the allocator's interface (gsi_gp_cookie/advance/done). Reclaim
 * POISONS the object and parks it in a graveyard before it is really
 * freed, so a reader that still sees a reclaimed object fails the run.
 * A barrier thread checks that gs_rcu_barrier() waits for every callback
 * queued before it. Readers also check, now and then, that a cookie taken
 * inside their critical section does not complete before they leave it.
 *
 * Oversubscribed: 7 readers + 4 writers + 1 barrier thread (run it on two
 * cores). Runs GS_TORTURE_SECONDS (default 3) or `--seconds N`.
 * Exit status 0 = no error detected.
 */
#include "graceslab.h"
#include "rcu/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NSLOTS 64
#define NREADERS 7
#define NWRITERS 4
#define MAGIC_LIVE 0x600dcafe600dcafeull
#define POISON 0x5a
#define GRAVE 4096

struct obj {
    uint64_t magic;
    uint64_t gen;
    uint64_t check; /* gen ^ magic ^ slot */
    long slot;
    struct gs_rcu_head rh;
    char payload[48];
};

/* Plain pointers: gs_rcu_dereference() and gs_rcu_assign_pointer() take an
   lvalue of pointer type (not _Atomic, which clang's builtins reject). */
static struct obj *slots[NSLOTS];
static atomic_int stop;
static atomic_ulong errors, reads, updates, cbs_queued, cbs_done, poll_checks;

/* Graveyard: poisoned objects wait here before free(), so that a premature
   reclaim is seen as poison rather than as a recycled, valid object. */
static pthread_mutex_t grave_lock = PTHREAD_MUTEX_INITIALIZER;
static struct obj *grave[GRAVE];
static unsigned grave_pos;

static void reclaim(struct obj *o)
{
    memset(o, POISON, sizeof *o);
    pthread_mutex_lock(&grave_lock);
    struct obj *old = grave[grave_pos];
    grave[grave_pos] = o;
    grave_pos = (grave_pos + 1) % GRAVE;
    pthread_mutex_unlock(&grave_lock);
    free(old);
}

static void reclaim_cb(struct gs_rcu_head *h)
{
    struct obj *o = (struct obj *)((char *)h - offsetof(struct obj, rh));
    if (o->magic != MAGIC_LIVE) {
        fprintf(stderr, "torture: callback on a non-live object %p\n", (void *)o);
        atomic_fetch_add(&errors, 1);
    }
    reclaim(o);
    atomic_fetch_add(&cbs_done, 1);
}

static struct obj *obj_new(long slot, uint64_t gen)
{
    struct obj *o = malloc(sizeof *o);
    if (!o) {
        fprintf(stderr, "torture: out of memory\n");
        exit(2);
    }
    o->slot = slot;
    o->gen = gen;
    o->check = gen ^ MAGIC_LIVE ^ (uint64_t)slot;
    memset(o->payload, (int)(gen & 0x7f), sizeof o->payload);
    o->magic = MAGIC_LIVE;
    return o;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool obj_valid(const struct obj *o, long slot)
{
    /* Read every field twice, apart: a reclaim racing with us shows. */
    uint64_t m = o->magic, g = o->gen, c = o->check;
    long s = o->slot;
    if (m != MAGIC_LIVE || c != (g ^ MAGIC_LIVE ^ (uint64_t)s) || s != slot)
        return false;
    for (size_t i = 0; i < sizeof o->payload; i++)
        if (o->payload[i] != (char)(g & 0x7f))
            return false;
    return o->magic == MAGIC_LIVE && o->gen == g;
}

static void *reader(void *arg)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
    unsigned long n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        uint64_t r = rnd(&seed);
        gs_rcu_read_lock();
        bool check_poll = (r & 63) == 0;
        unsigned long cookie = check_poll ? gs_rcu_get_state() : 0;
        int depth = (r >> 8) & 1;
        if (depth)
            gs_rcu_read_lock();
        for (int k = 0; k < 4; k++) {
            long s = (long)(rnd(&seed) % NSLOTS);
            struct obj *o = gs_rcu_dereference(slots[s]);
            if (o && !obj_valid(o, s)) {
                fprintf(stderr, "torture: reader saw a bad object %p in slot %ld (magic %llx)\n",
                        (void *)o, s, (unsigned long long)o->magic);
                atomic_fetch_add(&errors, 1);
            }
            if (((r >> 12) & 255) == 0)
                sched_yield(); /* get preempted inside now and then */
            if (o && !obj_valid(o, s)) {
                fprintf(stderr, "torture: object %p in slot %ld reclaimed under a reader\n",
                        (void *)o, s);
                atomic_fetch_add(&errors, 1);
            }
        }
        if (check_poll) {
            /* A full GP after the cookie must wait for this reader. */
            if (gs_rcu_poll_state(cookie)) {
                fprintf(stderr, "torture: poll_state true inside the reader that took the cookie\n");
                atomic_fetch_add(&errors, 1);
            }
            atomic_fetch_add_explicit(&poll_checks, 1, memory_order_relaxed);
        }
        if (depth)
            gs_rcu_read_unlock();
        gs_rcu_read_unlock();
        n++;
    }
    atomic_fetch_add(&reads, n);
    return NULL;
}

static void *writer(void *arg)
{
    long id = (long)arg;
    uint64_t seed = 0xdeadbeefull * (uint64_t)(id + 7);
    uint64_t gen = (uint64_t)id << 40;
    unsigned long n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        long s = (long)(rnd(&seed) % NSLOTS);
        struct obj *nw = obj_new(s, ++gen);
        /* Release via exchange: publishes *nw; the old object is unlinked. */
        struct obj *old = __atomic_exchange_n(&slots[s], nw, __ATOMIC_ACQ_REL);
        n++;
        if (!old)
            continue;
        switch ((id + n) % 5) {
        case 0:
            gs_synchronize_rcu();
            reclaim(old);
            break;
        case 1: /* counted after the call: the barrier checker's snapshot
                   then only holds callbacks that were really queued */
            gs_call_rcu(&old->rh, reclaim_cb);
            atomic_fetch_add(&cbs_queued, 1);
            break;
        case 2:
            gs_call_rcu_hurry(&old->rh, reclaim_cb);
            atomic_fetch_add(&cbs_queued, 1);
            break;
        case 3: {
            unsigned long c = gs_rcu_get_state();
            while (!gs_rcu_poll_state(c))
                sched_yield();
            reclaim(old);
            break;
        }
        default: {
            uint64_t c = gsi_gp_cookie();
            for (int i = 0; !gsi_gp_done(c); i++) {
                gsi_gp_advance();
                if (i > 100)
                    gsi_gp_wait(c);
                else
                    sched_yield();
            }
            reclaim(old);
            break;
        }
        }
    }
    atomic_fetch_add(&updates, n);
    return NULL;
}

static atomic_ulong barriers;

static void *barrier_checker(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        unsigned long q = atomic_load(&cbs_queued);
        gs_rcu_barrier();
        unsigned long d = atomic_load(&cbs_done);
        if (d < q) {
            fprintf(stderr, "torture: barrier returned with %lu of %lu earlier callbacks done\n",
                    d, q);
            atomic_fetch_add(&errors, 1);
        }
        atomic_fetch_add(&barriers, 1);
        usleep(20000);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long seconds = 3;
    const char *env = getenv("GS_TORTURE_SECONDS");
    if (env)
        seconds = atol(env);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--seconds") == 0)
            seconds = atol(argv[i + 1]);
    if (seconds <= 0)
        seconds = 3;

    for (long s = 0; s < NSLOTS; s++)
        __atomic_store_n(&slots[s], obj_new(s, 1), __ATOMIC_RELEASE);

    pthread_t rt[NREADERS], wt[NWRITERS], bt;
    for (long i = 0; i < NREADERS; i++)
        pthread_create(&rt[i], NULL, reader, (void *)i);
    for (long i = 0; i < NWRITERS; i++)
        pthread_create(&wt[i], NULL, writer, (void *)i);
    pthread_create(&bt, NULL, barrier_checker, NULL);

    sleep((unsigned)seconds);
    atomic_store(&stop, 1);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(rt[i], NULL);
    for (int i = 0; i < NWRITERS; i++)
        pthread_join(wt[i], NULL);
    pthread_join(bt, NULL);

    gs_rcu_barrier();
    unsigned long q = atomic_load(&cbs_queued), d = atomic_load(&cbs_done);
    if (q != d) {
        fprintf(stderr, "torture: %lu callbacks queued, %lu run after the final barrier\n", q, d);
        atomic_fetch_add(&errors, 1);
    }
    for (long s = 0; s < NSLOTS; s++) {
        struct obj *o = __atomic_load_n(&slots[s], __ATOMIC_ACQUIRE);
        if (!obj_valid(o, s)) {
            fprintf(stderr, "torture: slot %ld holds a bad object at the end\n", s);
            atomic_fetch_add(&errors, 1);
        }
        free(o);
    }
    for (int i = 0; i < GRAVE; i++)
        free(grave[i]);

    printf("torture: %lds, %lu read sections, %lu updates, %lu callbacks, %lu barriers, "
           "%lu in-reader poll checks, %lu grace periods, %lu errors\n",
           seconds, atomic_load(&reads), atomic_load(&updates), d, atomic_load(&barriers),
           atomic_load(&poll_checks), (unsigned long)gsi_gp_completed(), atomic_load(&errors));
    if (atomic_load(&reads) == 0 || atomic_load(&updates) == 0 || gsi_gp_completed() == 0) {
        fprintf(stderr, "torture: no progress\n");
        return 1;
    }
    return atomic_load(&errors) ? 1 : 0;
}
