/* cpu_gemv.c - several int4 matrix-vector products as one parallel sweep:
 * the column pairs of all jobs, in order, are cut into chunks (a few dozen
 * pairs: tens to hundreds of KB of contiguous tiles each) that the threads
 * take from a shared counter.  Each thread writes its own outputs: no
 * reduction.  On a machine shared with other work a preempted thread then
 * delays only the chunk it holds, not half of the sweep. */
#include "config.h"

#include <limits.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#include "cpu.h"

/* Spin this long before sleeping: longer than the usual skew between two
 * running threads at a barrier (tens of microseconds: a chunk), far
 * shorter than a scheduler time slice (milliseconds). */
#define SPIN_NS 50000

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void bar_sleep(int *gen, int seen)
{
#ifdef __linux__
    syscall(SYS_futex, gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)gen;
    (void)seen;
    sched_yield();
#endif
}

static void bar_wake(int *gen)
{
#ifdef __linux__
    syscall(SYS_futex, gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)gen;
#endif
}

void cpu_barrier(cpu_bar *b, int nt)
{
    const int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    long long t0;
    if (nt <= 1)
        return;
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == nt) {
        /* the last one in: reset, open, wake any sleepers */
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST) > 0)
            bar_wake(&b->gen);
        return;
    }
    t0 = now_ns();
    for (int i = 1;; i++) {
        if (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) != gen)
            return;
        CPU_RELAX();
        if ((i & 63) == 0 && now_ns() - t0 > SPIN_NS)
            break;
    }
    __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&b->gen, __ATOMIC_SEQ_CST) == gen)
        bar_sleep(&b->gen, gen);
    __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
}

/* Global pairs [lo, hi) of the jobs. */
static void run_range(const cpu_kernels *kern, const cpu_job *jobs, int njobs,
                      float *y, size_t lo, size_t hi)
{
    size_t at = 0;
    for (int j = 0; j < njobs && at < hi; j++) {
        size_t p0 = at, p1 = at + (size_t)jobs[j].pairs;
        at = p1;
        if (p1 <= lo)
            continue;
        if (p0 < lo)
            p0 = lo;
        if (p1 > hi)
            p1 = hi;
        p0 -= at - (size_t)jobs[j].pairs;
        p1 -= at - (size_t)jobs[j].pairs;
        cpu_gemv_pairs(kern, jobs[j].tiles, (int)p0, (int)p1, jobs[j].groups,
                       jobs[j].normal, jobs[j].x, y + jobs[j].yoff);
    }
}

void cpu_gemv_multi(const cpu_kernels *kern, const cpu_job *jobs, int njobs,
                    float *y, int *ctr, cpu_bar *bar)
{
    int nt = 1;
    size_t total = 0, chunk, nchunks;

#ifdef _OPENMP
    nt = omp_get_num_threads();
#endif
    for (int j = 0; j < njobs; j++)
        total += (size_t)jobs[j].pairs;
    if (nt == 1) {
        run_range(kern, jobs, njobs, y, 0, total);
        return;
    }
    chunk = cpu_gemv_chunk(total, nt);
    nchunks = (total + chunk - 1) / chunk;
    for (;;) {
        size_t c = (size_t)__atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED);
        if (c >= nchunks)
            break;
        run_range(kern, jobs, njobs, y, c * chunk,
                  c * chunk + chunk < total ? c * chunk + chunk : total);
    }
    if (bar)
        cpu_barrier(bar, nt);
}
