/* membw.c - a timed read of host memory, for hd_model_measure_bandwidth. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "cpu_features.h"
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

/* The same with the widest loads the CPU has.  Built for the baseline
 * instruction set, read_range issues 8- or 16-byte loads, and on an Intel
 * Xeon (2026-12-05, 2 threads) that loop was the limit, not the memory:
 * 17 GB/s against 35-37 GB/s for 32- and 64-byte loads over the same
 * buffer, so a step that reads at 20 GB/s came out "above" the limit.
 * The vector types are GCC's (no intrinsics headers, no extra flags); each
 * function is compiled for its instruction set by the target attribute and
 * called only where hd_cpu_detect says the CPU and the OS run it. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HD_WIDE_READ 1
/* aligned(8): the loads may start at any word (vmovdqu) */
typedef uint64_t hd_u64x4 __attribute__((vector_size(32), aligned(8)));
typedef uint64_t hd_u64x8 __attribute__((vector_size(64), aligned(8)));

__attribute__((target("avx2"))) static uint64_t read_range_avx2(const uint64_t *p, size_t n)
{
    hd_u64x4 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
    const hd_u64x4 *v = (const hd_u64x4 *)p;
    size_t i = 0, nv = n / 4;
    uint64_t s = 0;
    for (; i + 4 <= nv; i += 4) {
        a0 += v[i];
        a1 += v[i + 1];
        a2 += v[i + 2];
        a3 += v[i + 3];
    }
    a0 += a1 + a2 + a3;
    for (i *= 4; i < n; i++)
        s += p[i];
    return s + a0[0] + a0[1] + a0[2] + a0[3];
}

__attribute__((target("avx512f"))) static uint64_t read_range_avx512(const uint64_t *p, size_t n)
{
    hd_u64x8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
    const hd_u64x8 *v = (const hd_u64x8 *)p;
    size_t i = 0, nv = n / 8;
    uint64_t s = 0;
    for (; i + 4 <= nv; i += 4) {
        a0 += v[i];
        a1 += v[i + 1];
        a2 += v[i + 2];
        a3 += v[i + 3];
    }
    a0 += a1 + a2 + a3;
    for (i *= 8; i < n; i++)
        s += p[i];
    for (int j = 0; j < 8; j++)
        s += a0[j];
    return s;
}
#endif

typedef uint64_t (*read_fn)(const uint64_t *p, size_t n);

static read_fn widest_reader(void)
{
#ifdef HD_WIDE_READ
    const hd_cpu_features f = hd_cpu_detect();
    if (f.avx512f)
        return read_range_avx512;
    if (f.avx2)
        return read_range_avx2;
#endif
    return read_range;
}

uint64_t hd_host_read_sum(const uint64_t *p, size_t n)
{
    return widest_reader()(p, n);
}

hd_status hd_host_read_bandwidth(size_t bytes, int threads, int repeats,
                                 double *bytes_per_s)
{
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf, sink = 0;
    double best = 0.0;
    const read_fn rd = widest_reader();

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
            /* whole 64-byte lines a thread */
            const size_t part = n / (size_t)nt & ~(size_t)7;
            size_t lo = part * (size_t)t;
            size_t hi = t == nt - 1 ? n : part * (size_t)(t + 1);
            sink += rd(buf + lo, hi - lo);
        }
#else
        sink += rd(buf, n);
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
