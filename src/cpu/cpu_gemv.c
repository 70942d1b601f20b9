/* cpu_gemv.c - several int4 matrix-vector products as one parallel sweep:
 * the column pairs of all jobs, in order, are cut into one contiguous range
 * per thread.  A pair's tiles are contiguous in memory, so each thread
 * streams one range of memory and writes its own outputs: no reduction. */
#include "config.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"

void cpu_gemv_multi(const cpu_kernels *kern, const cpu_job *jobs, int njobs,
                    float *y)
{
    int t = 0, nt = 1;
    size_t total = 0, lo, hi, at = 0;

#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    for (int j = 0; j < njobs; j++)
        total += (size_t)jobs[j].pairs;
    lo = total * (size_t)t / (size_t)nt;
    hi = total * (size_t)(t + 1) / (size_t)nt;
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
#ifdef _OPENMP
#pragma omp barrier
#endif
}
