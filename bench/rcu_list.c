/*
 * Read-mostly linked list: a sorted singly linked list of 1000 nodes;
 * readers look up random keys under a read-side critical section, writers
 * replace a random node by an updated copy (copy-update) and defer the free
 * of the old one. Built twice, like rcu_defer.c:
 *   rcu_list_gs    gs_free_rcu
 *   rcu_list_urcu  liburcu-memb call_rcu + free (glibc or LD_PRELOAD)
 * Arguments: readers=N writers=N seconds=S. Prints a RESULT line with
 * lookups/s, updates/s, peak RSS and failed lookups (must be 0).
 */
#include "rcu_bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DEFER_GS
#include "graceslab.h"
#define read_lock() gs_rcu_read_lock()
#define read_unlock() gs_rcu_read_unlock()
#define reg_thread() gs_rcu_register_thread()
#define unreg_thread() gs_rcu_unregister_thread()
#define node_alloc() gs_malloc(sizeof(struct node))
#else
#include <urcu/urcu-memb.h>
#define read_lock() urcu_memb_read_lock()
#define read_unlock() urcu_memb_read_unlock()
#define reg_thread() urcu_memb_register_thread()
#define unreg_thread() urcu_memb_unregister_thread()
#define node_alloc() malloc(sizeof(struct node))
#endif

#define NODES 1000

struct node {
    struct node *next;
    long key, value, check;
#ifndef DEFER_GS
    struct rcu_head head;
#endif
};

static struct node *list_head;
static pthread_mutex_t update_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool stop;
static atomic_long total_lookups, total_updates, failed;

#ifndef DEFER_GS
static void free_node_cb(struct rcu_head *h)
{
    free(caa_container_of(h, struct node, head));
}
#endif

static void *reader(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    long n = 0;
    reg_thread();
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        r = r * 1103515245u + 12345u;
        long key = (long)((r >> 8) % NODES) * 2;
        read_lock();
        struct node *p = __atomic_load_n(&list_head, __ATOMIC_ACQUIRE);
        while (p && p->key < key)
            p = __atomic_load_n(&p->next, __ATOMIC_ACQUIRE);
        if (!p || p->key != key || p->check != p->key + p->value)
            atomic_fetch_add(&failed, 1);
        read_unlock();
        n++;
    }
    unreg_thread();
    atomic_fetch_add(&total_lookups, n);
    return NULL;
}

static void *writer(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 40503u + 7;
    long n = 0;
    reg_thread();
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        r = r * 1103515245u + 12345u;
        long key = (long)((r >> 8) % NODES) * 2;
        struct node *copy = node_alloc();
        pthread_mutex_lock(&update_lock);
        struct node **link = &list_head, *old;
        while ((old = *link)->key < key)
            link = &old->next;
        *copy = *old;
        copy->value = old->value + 1;
        copy->check = copy->key + copy->value;
        __atomic_store_n(link, copy, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&update_lock);
#ifdef DEFER_GS
        gs_free_rcu(old);
#else
        urcu_memb_call_rcu(&old->head, free_node_cb);
#endif
        n++;
    }
    unreg_thread();
    atomic_fetch_add(&total_updates, n);
    return NULL;
}

int main(int argc, char **argv)
{
    int readers = (int)rb_arg(argc, argv, "readers", 2);
    int writers = (int)rb_arg(argc, argv, "writers", 1);
    double seconds = rb_arg(argc, argv, "seconds", 2);
    for (long k = (NODES - 1) * 2; k >= 0; k -= 2) {
        struct node *p = node_alloc();
        p->key = k;
        p->value = 0;
        p->check = k;
        p->next = list_head;
        list_head = p;
    }
    pthread_t t[64];
    int n = 0;
    for (int i = 0; i < readers && n < 64; i++)
        pthread_create(&t[n++], NULL, reader, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < writers && n < 64; i++)
        pthread_create(&t[n++], NULL, writer, (void *)(uintptr_t)(i + 1));
    double t0 = rb_now();
    struct timespec d = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&stop, true);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    double el = rb_now() - t0;
    printf("RESULT name=rcu_list impl=%s readers=%d writers=%d lookups_per_sec=%.0f "
           "updates_per_sec=%.0f peak_rss_kb=%ld failed=%ld\n",
#ifdef DEFER_GS
           "gs_free_rcu",
#else
           "call_rcu",
#endif
           readers, writers, total_lookups / el, total_updates / el, rb_peak_rss_kb(), (long)failed);
    return failed != 0;
}
