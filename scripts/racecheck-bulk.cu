/* racecheck-bulk.cu - does compute-sanitizer's racecheck accept a bulk
 * copy (cp.async.bulk, completed on an mbarrier) into shared bytes that an
 * earlier bulk copy wrote, when the earlier one is known complete?
 *
 * The GEMV ring of the megakernel (src/cuda/gemv.cuh) reuses its slots
 * this way, and racecheck reports "Write access at bulk_g2s ... and Write
 * access at bulk_g2s" there.  Each mode below refills one 4 KB buffer
 * after the first copy completed, ordered in a different way; every one
 * of them is correct by the PTX memory model.  Run each under racecheck:
 *   nvcc -gencode arch=compute_90a,code=sm_90a -o rc racecheck-bulk.cu
 *   compute-sanitizer --tool racecheck ./rc MODE
 * Modes:
 *   0  the same thread issues both copies; every thread waits on the
 *      mbarrier after each, with __syncthreads between
 *   1  as 0, but thread 32 issues the second copy
 *   2  as 1, with fence.proxy.async before the second copy
 *   3  no __syncthreads: the readers arrive on an "empty" mbarrier, and
 *      the thread that issues the second copy waits on it (the ring's
 *      protocol)
 *   4  as 3, but the issuer also waits on the "full" mbarrier's phase of
 *      the first copy right before it issues the second
 *   5  only warp 0 waits on the "full" mbarrier and reads; then
 *      __syncthreads, and thread 32, which never waited, issues the
 *      second copy (the ring's order from one GEMV call to the next,
 *      before gemv_run's closing waits)
 *   6  as 4, but each fill is two copies (two halves of the buffer)
 *      completing on the one mbarrier, as a ring block's weights and
 *      constants do
 *   7  as 4, with the L2 cache hint (evict_first) on the copies
 *   8  as 1, but thread 0 invalidates the mbarrier after the first copy
 *      and thread 32 initializes it again before the second (the ring's
 *      barriers from one GEMV call to the next)
 *   9  thread 0 issues the first copy but only warp 1 waits on it and
 *      reads; __syncthreads; thread 64 issues the second (a refill that
 *      another group consumes, then the next call's first copy)
 * The program checks the bytes read and prints "ok MODE" or "BAD MODE". */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

#define NB 4096

__device__ __forceinline__ void mb_init(uint32_t b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(b), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_expect(uint32_t b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(b), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"(b) : "memory");
}
__device__ __forceinline__ void mb_wait(uint32_t b, uint32_t ph)
{
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(b), "r"(ph) : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk(uint32_t dst, const void *src, uint32_t bytes, uint32_t b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 : : "r"(dst), "l"(src), "r"(bytes), "r"(b) : "memory");
}

__device__ __forceinline__ void bulk_hint(uint32_t dst, const void *src, uint32_t bytes, uint32_t b)
{
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 : : "r"(dst), "l"(src), "r"(bytes), "r"(b), "l"(pol) : "memory");
}

/* One fill of the buffer: one copy, two halves (mode 6), or one copy with
 * a cache hint (mode 7). */
__device__ __forceinline__ void fill(uint32_t s, const uint32_t *src, uint32_t full, int mode)
{
    mb_expect(full, NB);
    if (mode == 6) {
        bulk(s, src, NB / 2, full);
        bulk(s + NB / 2, src + NB / 8, NB / 2, full);
    } else if (mode == 7) {
        bulk_hint(s, src, NB, full);
    } else {
        bulk(s, src, NB, full);
    }
}

__global__ void k(const uint32_t *src, int mode, int *bad)
{
    __shared__ alignas(128) uint32_t buf[NB / 4];
    __shared__ alignas(8) unsigned long long bars[2];
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(buf);
    const uint32_t full = (uint32_t)__cvta_generic_to_shared(&bars[0]), empty = full + 8;
    const int t = threadIdx.x;
    if (t == 0) {
        mb_init(full, 1);
        mb_init(empty, blockDim.x);
        asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
    }
    __syncthreads();
    if (t == 0)
        fill(s, src, full, mode);
    int sum = 0;
    if ((mode != 5 || t < 32) && (mode != 9 || (t >= 32 && t < 64))) {
        mb_wait(full, 0);
        for (int i = t % 32; i < NB / 4; i += 32)
            sum += buf[i] != (uint32_t)i;
    }
    const int issuer = mode == 0 ? 0 : mode == 9 ? 64 : 32;
    uint32_t ph2 = 1; /* the phase the second copy completes */
    if (mode == 8) {
        __syncthreads();
        if (t == 0) {
            asm volatile("mbarrier.inval.shared::cta.b64 [%0];" : : "r"(full) : "memory");
        }
        __syncthreads();
        if (t == issuer) {
            mb_init(full, 1);
            asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
        }
        ph2 = 0;
    }
    if (mode <= 2 || mode == 5 || mode >= 8) { /* ordered by __syncthreads */
        __syncthreads();
        if (t == issuer) {
            if (mode == 2)
                asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
            fill(s, src + NB / 4, full, mode);
        }
    } else {
        mb_arrive(empty);
        if (t == issuer) {
            mb_wait(empty, 0);
            if (mode >= 4)
                mb_wait(full, 0);
            asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
            fill(s, src + NB / 4, full, mode);
        }
    }
    if (mode == 8)
        __syncthreads(); /* the new barrier's initialization, before any wait on it */
    mb_wait(full, ph2);
    for (int i = t; i < NB / 4; i += blockDim.x)
        sum += buf[i] != (uint32_t)(NB / 4 + i);
    if (sum)
        atomicAdd(bad, sum);
}

int main(int argc, char **argv)
{
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    uint32_t h[NB / 2];
    for (int i = 0; i < NB / 2; i++)
        h[i] = (uint32_t)i;
    uint32_t *d;
    int *bad, hb = -1;
    if (cudaMalloc(&d, sizeof h) != cudaSuccess || cudaMalloc(&bad, sizeof(int)) != cudaSuccess)
        return 2;
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    cudaMemset(bad, 0, sizeof(int));
    k<<<1, 128>>>(d, mode, bad);
    cudaError_t e = cudaMemcpy(&hb, bad, sizeof hb, cudaMemcpyDeviceToHost);
    printf("%s %d (%s)\n", e == cudaSuccess && hb == 0 ? "ok" : "BAD", mode, cudaGetErrorString(e));
    return e == cudaSuccess && hb == 0 ? 0 : 1;
}
