/* common.cuh - small device helpers of the megakernel: bf16 rounding, loads,
 * the grid barrier, block reductions, RMSNorm into the x layout. */
#ifndef HD_CUDA_COMMON_CUH
#define HD_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <math.h>

#include "hd_cuda.h"

#define HDC_D 2304
#define HDC_A 4096

__device__ __forceinline__ float bf16f(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

/* bf(x): round to bf16 (nearest even) and back. */
__device__ __forceinline__ float bfr(float x)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ uint16_t f2bf(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* Weights: read-only for the whole launch, streamed once. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Values other CTAs wrote in this launch: bypass L1. */
__device__ __forceinline__ float ldcg(const float *p) { return __ldcg(p); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

/* Grid-wide barrier: bar[0] counts arrivals, bar[1] is the generation.  The
 * last CTA to arrive resets the count and publishes the next generation, so
 * the words are back at rest after every barrier (and every launch). */
__device__ __forceinline__ void grid_sync(unsigned *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned gen = ld_acquire(bar + 1);
        __threadfence();
        unsigned arrived = atomicAdd(bar, 1u);
        if (arrived == gridDim.x - 1) {
            bar[0] = 0;
            __threadfence();
            st_release(bar + 1, gen + 1);
        } else {
            while (ld_acquire(bar + 1) == gen)
                __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block, the same order every time; red: HDC_WARPS floats. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < HDC_WARPS; w++)
        t += red[w];
    __syncthreads();
    return t;
}

__device__ __forceinline__ float silu(float y) { return y / (1.0f + expf(-y)); }

/* Fills the padded x layout: value i at xs[(i/32)*36 + i%32], and the sum of
 * each chunk of 32 at xs[c*36 + 32].  Ends with __syncthreads. */
__device__ __forceinline__ void xs_chunk_sums(float *xs, int n)
{
    __syncthreads();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = w; c < n / 32; c += HDC_WARPS) {
        float s = warp_sum(xs[c * HDC_XS_STRIDE + lane]);
        if (lane == 0)
            xs[c * HDC_XS_STRIDE + 32] = s;
    }
    __syncthreads();
}

/* x = bf(h * rsqrt(mean(h^2) + eps) * weight) into the padded layout. */
__device__ void rmsnorm_xs(const float *h, const uint16_t *hin,
                           const uint16_t *weight, float *xs, float *red)
{
    constexpr int NV = (HDC_D + HDC_THREADS - 1) / HDC_THREADS;
    float v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) { /* all loads in flight at once */
        int i = threadIdx.x + j * HDC_THREADS;
        v[j] = i < HDC_D ? (hin ? bf16f(hin[i]) : ldcg(h + i)) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NV; j++)
        ss += v[j] * v[j];
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)HDC_D + 1e-6f);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int i = threadIdx.x + j * HDC_THREADS;
        if (i < HDC_D)
            xs[(i >> 5) * HDC_XS_STRIDE + (i & 31)] = bfr(v[j] * inv * bf16f(weight[i]));
    }
    xs_chunk_sums(xs, HDC_D);
}

/* A vector of N values other CTAs wrote (global) into the padded layout,
 * every thread's loads in flight at once. */
template <int N>
__device__ void load_xs(const float *src, float *xs)
{
    constexpr int NV = (N + HDC_THREADS - 1) / HDC_THREADS;
    float v[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int i = threadIdx.x + j * HDC_THREADS;
        v[j] = i < N ? ldcg(src + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int i = threadIdx.x + j * HDC_THREADS;
        if (i < N)
            xs[(i >> 5) * HDC_XS_STRIDE + (i & 31)] = v[j];
    }
    xs_chunk_sums(xs, N);
}

/* Phase timestamps (CTA 0, thread 0), read by HD_CUDA_PHASES=1. */
__device__ __forceinline__ void phase_mark(unsigned long long *t, int &k)
{
    if (blockIdx.x == 0 && threadIdx.x == 0 && k < 127) {
        unsigned long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        t[k] = ns;
    }
    k++;
}

#endif
