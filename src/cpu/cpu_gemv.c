/* cpu_gemv.c - several int4 matrix-vector products as one parallel sweep:
 * the column pairs of all jobs, in order, are cut into chunks (a few dozen
 * pairs: tens to hundreds of KB of contiguous tiles each) that the threads
 * take from a shared counter.  Each thread writes its own outputs: no
 * reduction.  On a machine shared with other work a preempted thread then
 * delays only the chunk it holds, not half of the sweep. */
#include "config.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"

/* Chunks per thread per sweep: enough to even out a slow thread, few
 * enough that the counter (one cache line the threads pass around) and the
 * restart of the hardware prefetcher at each chunk stay cheap. */
#define CHUNKS_PER_THREAD 8

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
        kern->gemv_pairs(jobs[j].tiles, (int)p0, (int)p1, jobs[j].groups,
                         jobs[j].x->xd, y + jobs[j].yoff);
    }
}

void cpu_gemv_multi(const cpu_kernels *kern, const cpu_job *jobs, int njobs,
                    float *y, int *ctr)
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
    /* an even number of pairs, so that the kernel's two-pair passes line up */
    chunk = (total / ((size_t)nt * CHUNKS_PER_THREAD) + 1) & ~(size_t)1;
    nchunks = (total + chunk - 1) / chunk;
    for (;;) {
        size_t c = (size_t)__atomic_fetch_add(ctr, 1, __ATOMIC_RELAXED);
        if (c >= nchunks)
            break;
        run_range(kern, jobs, njobs, y, c * chunk,
                  c * chunk + chunk < total ? c * chunk + chunk : total);
    }
#ifdef _OPENMP
#pragma omp barrier
#endif
}
