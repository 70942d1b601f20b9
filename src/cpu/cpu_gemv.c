/* cpu_gemv.c - several int4 matrix-vector products as one parallel sweep:
 * the column pairs of all jobs, in order, are cut into chunks (a few dozen
 * pairs: tens to hundreds of KB of contiguous tiles each), and the chunks
 * into one run per thread.  A thread takes the chunks of its own run from
 * the front, in order, so that it streams one range of memory and the
 * kernels' prefetch of the next block, at a chunk's end, is for the chunk
 * it takes next; a thread whose run is done takes the chunks of the
 * others from their back (cpu_sweep_next).  Each thread writes its own
 * outputs: no reduction.  On a machine shared with other work a preempted
 * thread then delays only the chunk it holds, not half of the sweep. */
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

/* One of run r's chunks [nchunks r / nt, nchunks (r + 1) / nt) from the
 * front (its owner) or the back (another thread): runs[r] counts the
 * chunks taken from the front in the low 32 bits and from the back in the
 * high 32. */
static int take(uint64_t *runs, size_t nchunks, int r, int nt, int front, size_t *chunk)
{
    uint64_t *word = &runs[r];
    const size_t lo = nchunks * (size_t)r / (size_t)nt;
    const size_t hi = nchunks * (size_t)(r + 1) / (size_t)nt;
    uint64_t s = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        const size_t f = (size_t)(uint32_t)s, b = (size_t)(s >> 32);
        const uint64_t next = front ? s + 1u : s + ((uint64_t)1 << 32);
        if (lo + f + b >= hi)
            return 0;
        /* relaxed: the chunks' outputs are disjoint, and the sweep's
         * barrier orders them for their readers */
        if (__atomic_compare_exchange_n(word, &s, next, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *chunk = front ? lo + f : hi - 1 - b;
            return 1;
        }
    }
}

int cpu_sweep_next(uint64_t *runs, size_t nchunks, int t, int nt, size_t *chunk)
{
    if (take(runs, nchunks, t, nt, 1, chunk))
        return 1;
    for (int k = 1; k < nt; k++)
        if (take(runs, nchunks, (t + k) % nt, nt, 0, chunk))
            return 1;
    return 0;
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
                    float *y, uint64_t *runs, cpu_bar *bar)
{
    int t = 0, nt = 1;
    size_t total = 0, chunk, nchunks, c;

#ifdef _OPENMP
    t = omp_get_thread_num();
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
    while (cpu_sweep_next(runs, nchunks, t, nt, &c))
        run_range(kern, jobs, njobs, y, c * chunk,
                  c * chunk + chunk < total ? c * chunk + chunk : total);
    if (bar)
        cpu_barrier(bar, nt);
}
