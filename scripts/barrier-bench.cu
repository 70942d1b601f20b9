/* barrier-bench.cu - does a grid barrier wait for bulk copies in flight?
 *
 * One CTA an SM (cooperative launch), ITERS rounds of: a few global stores
 * (a phase's outputs), optionally NB bulk copies of 20 KB from a 2 GB
 * buffer (cold, DRAM) into shared memory, a grid barrier like the
 * module's grid_sync (__syncthreads, thread 0's red.release.gpu add, its
 * ld.acquire spin, __syncthreads), then the wait for the copies.
 *
 * Modes (who issues the copies, and when the CTA waits for them):
 *   0  no copies: the barrier alone
 *   1  thread 0 issues, the CTA waits after the barrier
 *   2  thread 32 (warp 1) issues, the CTA waits after the barrier
 *   3  thread 0 issues, the CTA waits before the barrier (serial)
 *   4  thread 32 issues, waits after; the barrier's arrival is a
 *      fence.acq_rel.gpu then a relaxed red (the same ordering, spelt out)
 *   5  thread 0 issues, waits after; thread 0's barrier arrival is a
 *      relaxed red with no fence at all (wrong as a barrier: a control,
 *      to see what the release itself costs)
 *   6  the release first: thread 0's fence.acq_rel.gpu once the stores
 *      are done, then thread 32 issues, then thread 0's relaxed red (the
 *      same ordering of the stores as 0-4, the copies left out of it)
 * If 1 is about 3 and 2 about max(0, the copies alone), the release waits
 * for the issuing thread's copies.
 *
 * Prints, for CTA 0: the round's mean time, the mean time thread 0 spends
 * from the barrier's arrival to its end, and the mean wait for the
 * copies after the barrier.
 * Usage: barrier-bench MODE NB [ITERS] */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>
#include "gemv.cuh" /* the module's mbarrier and barrier primitives */

#define THREADS HDC_THREADS
#define CHUNK (20 * 1024)
#define SMEM (5 * CHUNK + 64)
#define BUF_BYTES (2ull << 30)

__device__ __forceinline__ unsigned long long now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void __launch_bounds__(THREADS, 1)
bench(int mode, int nb, int iters, const char *buf, unsigned *bar, float *out,
      unsigned long long *res)
{
    extern __shared__ __align__(128) unsigned char sm[];
    const uint32_t dst = smem_addr(sm + 64), mb = smem_addr(sm);
    const int issuer = (mode == 2 || mode == 4 || mode == 6) ? 32 : 0;
    unsigned target = 0;
    unsigned long long t_bar = 0, t_wait = 0, t0 = 0;
    if (threadIdx.x == 0) {
        mbar_init(mb, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        t0 = now();
    for (int it = 0; it < iters; it++) {
        /* a phase's outputs */
        if (threadIdx.x < 128)
            out[((size_t)it * gridDim.x + blockIdx.x) % (1u << 20) * 128 + threadIdx.x] =
                (float)it;
        if (mode == 6) {
            __syncthreads();
            if (threadIdx.x == 0)
                asm volatile("fence.acq_rel.gpu;" : : : "memory");
            __syncthreads();
        }
        if (mode != 0 && threadIdx.x == issuer) {
            const size_t off = ((size_t)it * gridDim.x + blockIdx.x) * nb * CHUNK % BUF_BYTES;
            mbar_expect_tx(mb, (uint32_t)(nb * CHUNK));
            for (int j = 0; j < nb; j++)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                             " [%0], [%1], %2, [%3];"
                             : : "r"(dst + j * CHUNK), "l"(buf + off + (size_t)j * CHUNK),
                                 "r"((uint32_t)CHUNK), "r"(mb) : "memory");
        }
        if (mode == 3)
            mbar_wait(mb, it & 1);
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned long long a = now();
            target += gridDim.x;
            if (mode == 4)
                asm volatile("fence.acq_rel.gpu;" : : : "memory");
            if (mode >= 4)
                red_relaxed_add(bar, 1u);
            else
                red_release_add(bar, 1u);
            while ((int)(ld_acquire(bar) - target) < 0)
                ;
            t_bar += now() - a;
        }
        __syncthreads();
        if (mode != 0 && mode != 3) {
            const unsigned long long a = threadIdx.x == 0 ? now() : 0;
            mbar_wait(mb, it & 1);
            if (threadIdx.x == 0)
                t_wait += now() - a;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        res[0] = now() - t0;
        res[1] = t_bar;
        res[2] = t_wait;
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODE NB [ITERS]\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]), nb = atoi(argv[2]), iters = argc > 3 ? atoi(argv[3]) : 2000;
    if (mode < 0 || mode > 6 || nb < 1 || nb > 5 || iters < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    char *buf;
    unsigned *bar;
    float *out;
    unsigned long long *res, h[3];
    if (cudaMalloc(&buf, BUF_BYTES) != cudaSuccess || cudaMalloc(&bar, 4) != cudaSuccess ||
        cudaMalloc(&out, (size_t)128 << 22) != cudaSuccess || cudaMalloc(&res, 24) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 1;
    }
    cudaMemset(buf, 1, BUF_BYTES);
    cudaFuncSetAttribute(bench, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    double best = 1e30, bb = 0, bw = 0;
    for (int rep = 0; rep < 5; rep++) {
        cudaMemset(bar, 0, 4);
        void *args[] = {&mode, &nb, &iters, &buf, &bar, &out, &res};
        cudaError_t e = cudaLaunchCooperativeKernel((const void *)bench, dim3(sms), dim3(THREADS),
                                                    args, SMEM, 0);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "launch: %s\n", cudaGetErrorString(e));
            return 1;
        }
        cudaMemcpy(h, res, sizeof h, cudaMemcpyDeviceToHost);
        const double r = h[0] * 1e-3 / iters;
        if (r < best) {
            best = r;
            bb = h[1] * 1e-3 / iters;
            bw = h[2] * 1e-3 / iters;
        }
    }
    printf("mode %d nb %d (%d KB a CTA, %.1f MB a round): round %.3f us, barrier %.3f us, "
           "wait after %.3f us (best of 5, %d rounds, %d CTAs)\n",
           mode, nb, nb * CHUNK / 1024, (double)nb * CHUNK * sms / 1e6, best, bb, bw, iters, sms);
    return 0;
}
