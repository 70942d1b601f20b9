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

/* Starts bringing bytes (16-byte aligned, a multiple of 16) into L2; no
 * completion to wait for.  Issued by one thread. */
__device__ __forceinline__ void l2_prefetch(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                 : : "l"(p), "r"(bytes) : "memory");
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

/* Grid-wide barrier.  bar[0] counts arrivals and only grows; bar[1] is its
 * value when a launch begins (written by the last CTA to leave the previous
 * launch, grid_exit); bar[2] counts the CTAs that left.  The k-th barrier
 * of a launch is passed when bar[0] reaches bar[1] + k * gridDim.x, so an
 * arrival is one reduction and nobody has to publish a generation (one
 * round trip to L2 less than a count + generation pair).  Differences are
 * taken modulo 2^32.  *target: this CTA's last target (thread 0 only). */
__device__ __forceinline__ void red_release_add(unsigned *p, unsigned v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

/* The same add, relaxed: a release only where a fence came before it. */
__device__ __forceinline__ void red_relaxed_add(unsigned *p, unsigned v)
{
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned grid_base(const unsigned *bar)
{
    return threadIdx.x == 0 ? ld_acquire(bar + 1) : 0u;
}

/* relaxed: thread 0 already made the CTA's writes visible (prime_fence in
 * mega.cu: a fence.acq_rel.gpu after them, so that the release does not
 * also wait for the bulk copies issued since), and arrives with a relaxed
 * add; the fence and the add form the release pattern of the PTX memory
 * model. */
__device__ __forceinline__ void grid_sync(unsigned *bar, unsigned &target, bool relaxed = false)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        target += gridDim.x;
        if (relaxed)
            red_relaxed_add(bar, 1u);
        else
            red_release_add(bar, 1u);
        while ((int)(ld_acquire(bar) - target) < 0)
            ;
    }
    __syncthreads();
}

/* Flags: counts of finished tasks that a consumer waits for instead of a
 * grid barrier, where it needs the output of a few tasks only (P.flags;
 * HDC_FL_HEAD + h: the 4 projection tasks of KDA head h, HDC_FL_BETA: the
 * betas, HDC_FL_EXPERT + j: the 32 gate/up tasks of routed expert j).
 * The producer's threads store and meet at a __syncthreads, then thread 0
 * adds with release semantics (which covers the stores the barrier
 * ordered before it); the consumer's thread 0 waits with acquire loads
 * and a __syncthreads passes that on, as in grid_sync
 * (the data are read with ld.global.cg: never from a stale L1 line).  The
 * counts go back to 0 in each router phase (moe_router), which a grid
 * barrier separates from every producer and consumer of the counts. */
#define HDC_FL_HEAD 0
#define HDC_FL_BETA 32
#define HDC_FL_EXPERT 40
#ifdef HDC_SHARED_IN_X
#define HDC_FL_COUNT 49 /* and HDC_FL_EXPERT + 8: the shared expert (moe.cuh) */
#else
#define HDC_FL_COUNT 48
#endif
/* HDC_ROUTER_FLAG (a build switch, off): the experts phase waits for the
 * router's logit tasks (HDC_FL_LOGITS) and the shared expert's down map
 * for its gate/up tasks (HDC_FL_SHARED) instead of a grid barrier.  The
 * two are not among the HDC_FL_COUNT that moe_router sets back to 0 (it
 * runs while they count); each layer's output projection does (mega.cu). */
#define HDC_FL_LOGITS 48
#define HDC_FL_SHARED 49
#ifdef HDC_ROUTER_FLAG
#define HDC_ROUTER_FLAGS 1
#else
#define HDC_ROUTER_FLAGS 0
#endif

__device__ __forceinline__ void flag_signal(unsigned *flag, unsigned n = 1u)
{
    __syncthreads();
    if (threadIdx.x == 0)
        red_release_add(flag, n);
}

/* Until flag reaches count (and flag2 count2, if given).  Every thread
 * calls; ends with __syncthreads. */
__device__ __forceinline__ void flag_wait(const unsigned *flag, unsigned count,
                                          const unsigned *flag2 = nullptr,
                                          unsigned count2 = 0)
{
    if (threadIdx.x == 0)
        while (ld_acquire(flag) < count || (flag2 && ld_acquire(flag2) < count2))
            ;
    __syncthreads();
}

/* The end of a launch: the last CTA out records where the count stands. */
__device__ __forceinline__ void grid_exit(unsigned *bar, unsigned target)
{
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(bar + 2, 1u) == gridDim.x - 1) {
            bar[2] = 0;
            st_release(bar + 1, target);
        }
    }
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

/* Shared-memory map of the GEMV phases (floats): the padded x layout (up
 * to 4096 values), the tile partials (up to 18 blocks; also the top-8's key
 * stage), the tile outputs, small things, the merge's split statistics, x
 * as B fragments (up to 4096 values, 3 parts); the GEMV ring follows
 * (gemv.cuh). */
#define SM_XS 0
#define SM_RED 4608
#define SM_OUT 9216
#define SM_MISC 9504
#define SM_SEL (SM_MISC + 32) /* the top-8 choice: 8 ints, then 8 weights */
#define SM_WT (SM_MISC + 40)
#define MERGE_STATS 10496
#define SM_XB 12544
#define SM_XB_END (SM_XB + 4096 / 16 * 12 * 2)

__device__ __forceinline__ uint32_t bf2_pack(float lo, float hi)
{
    return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

/* Part p (0 hi, 1 mid, 2 lo) of x = hi + mid + lo, each a bf16; exact for
 * normal fp32 x (8 + 8 + 8 significant bits). */
__device__ __forceinline__ float bf_part(float x, int p)
{
    float hi = bfr(x);
    if (p == 0)
        return hi;
    float r = x - hi, mid = bfr(r);
    return p == 1 ? mid : bfr(r - mid);
}

/* Two bf16 values (exact) into one bf16x2 word. */
__device__ __forceinline__ uint32_t bf2_exact(float lo, float hi)
{
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

/* x (n values in the padded layout xs) as the B fragments of
 * mma.m16n8k16: entry (16-row step s, lane l) holds, for part l / 4, the
 * values 16 s + 2 (l % 4) + {0, 1, 8, 9}; parts 1 when x is bf16 already
 * (lanes 0-3 only), else 3.  xb sits at SM_XB of the same shared memory as
 * xs (which is at SM_XS).  Starts and ends with __syncthreads. */
__device__ __forceinline__ void xs_finish(float *xs, int n, int parts)
{
    uint2 *xb = reinterpret_cast<uint2 *>(xs - SM_XS + SM_XB);
    __syncthreads();
    for (int e = threadIdx.x; e < n / 4; e += HDC_THREADS) {
        const int st = e >> 2, tq = e & 3, k = 16 * st + 2 * tq;
        const float *x = xs + (k >> 5) * HDC_XS_STRIDE + (k & 31);
        const float2 a = *reinterpret_cast<const float2 *>(x);
        const float2 b = *reinterpret_cast<const float2 *>(x + 8);
        const float v[4] = {a.x, a.y, b.x, b.y};
        float hi[4], mid[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            hi[i] = bfr(v[i]);
            float r = v[i] - hi[i];
            mid[i] = bfr(r);
            lo[i] = bfr(r - mid[i]);
        }
        uint2 *d = xb + st * 12 + tq;
        d[0] = make_uint2(bf2_exact(hi[0], hi[1]), bf2_exact(hi[2], hi[3]));
        if (parts > 1) {
            d[4] = make_uint2(bf2_exact(mid[0], mid[1]), bf2_exact(mid[2], mid[3]));
            d[8] = make_uint2(bf2_exact(lo[0], lo[1]), bf2_exact(lo[2], lo[3]));
        }
    }
    __syncthreads();
}

/* What a phase does once its vector's loads are in (rmsnorm_xs, load_xs):
 * nothing, or start its first GEMV's weight copies (gemv_prime_late). */
struct NoHook {
    __device__ void operator()() const {}
};

/* x = bf(h * rsqrt(mean(h^2) + eps) * weight) into the padded layout;
 * hook() (every thread) once this thread's h is in registers. */
template <typename Hook = NoHook>
__device__ void rmsnorm_xs(const float *h, const uint16_t *hin,
                           const uint16_t *weight, float *xs, float *red,
                           const Hook &hook = Hook())
{
    constexpr int NV = (HDC_D + HDC_THREADS - 1) / HDC_THREADS;
    float v[NV], wn[NV];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) { /* all loads in flight at once, the norm's too */
        int i = threadIdx.x + j * HDC_THREADS;
        v[j] = i < HDC_D ? (hin ? bf16f(hin[i]) : ldcg(h + i)) : 0.0f;
        wn[j] = i < HDC_D ? bf16f(__ldg(weight + i)) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NV; j++)
        ss += v[j] * v[j];
#ifdef HDC_HOOK_AFTER_W
    /* (a measurement switch) the hook waits for the norm's weights too:
     * 0 * w is a zero for every finite w, so ss keeps its value */
#pragma unroll
    for (int j = 0; j < NV; j++)
        ss += 0.0f * wn[j];
#endif
    hook();
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)HDC_D + 1e-6f);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int i = threadIdx.x + j * HDC_THREADS;
        if (i < HDC_D)
            xs[(i >> 5) * HDC_XS_STRIDE + (i & 31)] = bfr(v[j] * inv * wn[j]);
    }
    xs_finish(xs, HDC_D, 1);
}

/* A layer's x = norm(h) (rmsnorm_xs); in the step's first layer h is the
 * step's input (device scratch, or the launch's parameters), which CTA 0
 * also stores as h. */
template <typename Hook = NoHook>
__device__ __forceinline__ void layer_norm_in(const StepParams &P, const uint16_t *weight,
                                              bool first, float *xs, float *red,
                                              const Hook &hook = Hook())
{
    const uint16_t *hin = P.hin ? P.hin : P.hin_v;
    rmsnorm_xs(P.h, first ? hin : nullptr, weight, xs, red, hook);
    if (first && blockIdx.x == 0)
        for (int i = threadIdx.x; i < HDC_D; i += HDC_THREADS)
            P.h[i] = bf16f(hin[i]);
}

/* A vector of N values other CTAs wrote (global) into the padded layout,
 * every thread's loads in flight at once; parts as for xs_finish; hook()
 * (every thread) once the values are in shared memory. */
template <int N, typename Hook = NoHook>
__device__ void load_xs(const float *src, float *xs, int parts, const Hook &hook = Hook())
{
    static_assert(N <= 4096, "the shared-memory map holds up to 4096 values of x");
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
    hook();
    xs_finish(xs, N, parts);
}

/* The trace's buffer in layer 0, where HD_CUDA_TRACE records; else none. */
__device__ __forceinline__ unsigned long long *layer_trace(const StepParams &P, const LayerDev &L)
{
    return &L == &P.layers[0] ? P.trace : nullptr;
}

/* HD_CUDA_TRACE: every CTA's time at point id of layer 0 (thread 0). */
__device__ __forceinline__ void trace_mark(unsigned long long *tr, int id)
{
    if (tr && threadIdx.x == 0) {
        unsigned long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        tr[blockIdx.x * HDC_TRACE_PTS + id] = ns;
    }
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
