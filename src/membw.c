/* membw.c - a timed read of host memory, for hd_model_measure_bandwidth. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sums 64-bit words in 8 independent chains so that the loop is limited by
 * memory, not by the adds; the sum is returned so the reads stay. */
static uint64_t read_range(const uint64_t *p, size_t n)
{
    uint64_t a[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            a[j] += p[i + j];
    for (; i < n; i++)
        a[0] += p[i];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

hd_status hd_host_read_bandwidth(size_t bytes, int threads, int repeats,
                                 double *bytes_per_s)
{
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf, sink = 0;
    double best = 0.0;

    if (n == 0 || repeats < 1)
        return HD_ERR_INVALID_ARGUMENT;
    buf = hd_alloc_aligned(n * sizeof(uint64_t)); /* zeroed: pages touched */
    if (!buf)
        return HD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i += 512)
        buf[i] = i;
    if (threads < 1)
        threads = 1;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_s(), dt;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = n / (size_t)nt * (size_t)t;
            size_t hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
            sink += read_range(buf + lo, hi - lo);
        }
#else
        sink += read_range(buf, n);
#endif
        dt = now_s() - t0;
        if (dt > 0 && (double)(n * sizeof(uint64_t)) / dt > best)
            best = (double)(n * sizeof(uint64_t)) / dt;
    }
    hd_free_aligned(buf);
    /* Keep the sum observable so the reads cannot be optimized away. */
    __asm__ volatile("" : : "r"(sink));
    *bytes_per_s = best;
    return HD_OK;
}
