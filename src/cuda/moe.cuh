/* moe.cuh - the mixture of experts in three phases: router logits with the
 * shared expert's gate/up; the 8 routed experts' gate/up; all 9 down
 * projections with the weighted sum and the residual. */
#ifndef HD_CUDA_MOE_CUH
#define HD_CUDA_MOE_CUH

#include "kda.cuh"

#define MOE_I 1024

/* Phase R: x = norm(h); router logits (16 experts a task, one a warp) and
 * the shared expert's f = silu(x gate) * (x up) (32 tiles). */
__device__ __noinline__ void moe_router(const StepParams &P, const LayerDev &L, float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    rmsnorm_xs(P.h, nullptr, L.moe_norm, xs, sm + SM_MISC);
    const int E = P.experts;
    const int ntask = MOE_I / 32 + (E + HDC_WARPS - 1) / HDC_WARPS;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int task = blockIdx.x; task < ntask; task += gridDim.x) {
        if (task < MOE_I / 32) {
            int n0 = task * 32;
            MatTile m[2] = {mat_tile(L.sgate, 0, n0, xs), mat_tile(L.sup, 0, n0, xs)};
            gemv_tile<32, 2>(m, HDC_D / 32, red, out);
            if (threadIdx.x < 32)
                P.ff[8 * MOE_I + n0 + threadIdx.x] = silu(out[threadIdx.x]) * out[32 + threadIdx.x];
        } else {
            int e = (task - MOE_I / 32) * HDC_WARPS + w;
            if (e < E) {
                const uint4 *r = reinterpret_cast<const uint4 *>(L.router + (size_t)e * HDC_D);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < HDC_D / 256; i++) {
                    int t = lane + 32 * i; /* values 8t .. 8t + 7 */
                    uint4 v = __ldg(r + t);
                    const float *x = xs + ((8 * t) >> 5) * HDC_XS_STRIDE + ((8 * t) & 31);
                    float4 xa = *reinterpret_cast<const float4 *>(x);
                    float4 xb = *reinterpret_cast<const float4 *>(x + 4);
                    s = fmaf(xa.x, __uint_as_float(v.x << 16), s);
                    s = fmaf(xa.y, __uint_as_float(v.x & 0xffff0000u), s);
                    s = fmaf(xa.z, __uint_as_float(v.y << 16), s);
                    s = fmaf(xa.w, __uint_as_float(v.y & 0xffff0000u), s);
                    s = fmaf(xb.x, __uint_as_float(v.z << 16), s);
                    s = fmaf(xb.y, __uint_as_float(v.z & 0xffff0000u), s);
                    s = fmaf(xb.z, __uint_as_float(v.w << 16), s);
                    s = fmaf(xb.w, __uint_as_float(v.w & 0xffff0000u), s);
                }
                s = warp_sum(s);
                if (lane == 0)
                    P.logits[e] = bfr(s);
            }
        }
    }
}

/* a ranks above b: the larger number, NaN below every number, ties to the
 * lower index; index -1 is "none". */
__device__ __forceinline__ bool ranks_above(float av, int ai, float bv, int bi)
{
    if (ai < 0)
        return false;
    if (bi < 0)
        return true;
    bool an = isnan(av), bn = isnan(bv);
    if (an || bn)
        return an && bn ? ai < bi : bn;
    if (av != bv)
        return av > bv;
    return ai < bi;
}

/* Top-8 of the logits into sel[8] / wt[8] (shared memory), by warp 0; the
 * indices are always 8 distinct values in [0, E).  The logits are first
 * staged in shared memory (stage: room for TOP8_STAGE) by all threads.
 * Ends with a barrier. */
#define TOP8_STAGE 4096
__device__ __noinline__ void top8(const StepParams &P, int *sel, float *wt,
                                  float *stage)
{
    const bool staged = P.experts <= TOP8_STAGE;
    if (staged) {
        for (int e = threadIdx.x; e < P.experts; e += HDC_THREADS)
            stage[e] = ldcg(P.logits + e);
        __syncthreads();
    }
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        for (int j = 0; j < 8; j++) {
            float bv = 0.0f;
            int bi = -1;
            for (int e = lane; e < P.experts; e += 32) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken |= sel[i] == e;
                float v = staged ? stage[e] : ldcg(P.logits + e);
                if (!taken && ranks_above(v, e, bv, bi)) {
                    bv = v;
                    bi = e;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ranks_above(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            if (lane == 0) {
                sel[j] = bi;
                wt[j] = bv;
            }
            __syncwarp();
        }
        if (lane == 0) {
            float total = 0.0f, w8[8];
            for (int j = 0; j < 8; j++) {
                w8[j] = expf(wt[j] - wt[0]);
                total += w8[j];
            }
            for (int j = 0; j < 8; j++)
                wt[j] = w8[j] / total * 2.446f;
        }
    }
    __syncthreads();
}

/* Phase X: the 8 routed experts' f_j = silu(x gate_j) * (x up_j): 8 x 32
 * tiles.  CTA 0 publishes the choice for phase D. */
__device__ __noinline__ void moe_experts(const StepParams &P, const LayerDev &L, float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    int *sel = reinterpret_cast<int *>(sm + SM_MISC + 32);
    float *wt = sm + SM_MISC + 40;
    rmsnorm_xs(P.h, nullptr, L.moe_norm, xs, sm + SM_MISC);
    top8(P, sel, wt, red);
    if (blockIdx.x == 0 && threadIdx.x < 8) {
        P.route[threadIdx.x] = __int_as_float(sel[threadIdx.x]);
        P.route[8 + threadIdx.x] = wt[threadIdx.x];
    }
    for (int task = blockIdx.x; task < 8 * (MOE_I / 32); task += gridDim.x) {
        int j = task / (MOE_I / 32), n0 = (task % (MOE_I / 32)) * 32;
        int e = sel[j];
        MatTile m[2] = {mat_tile(L.gate, e, n0, xs), mat_tile(L.up, e, n0, xs)};
        gemv_tile<32, 2>(m, HDC_D / 32, red, out);
        if (threadIdx.x < 32)
            P.ff[j * MOE_I + n0 + threadIdx.x] = silu(out[threadIdx.x]) * out[32 + threadIdx.x];
    }
}

/* Phase D: for 16 columns at a time (144 tasks) the 9 down projections,
 * t = bf(sum_j w_j y_j + y_shared), h = bf(h + t). */
__device__ __noinline__ void moe_down(const StepParams &P, const LayerDev &L, bool last,
                         float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    if (blockIdx.x >= HDC_D / 16)
        return;
    load_xs<9 * MOE_I>(P.ff, xs);
    int sel[8];
    float wt[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        sel[j] = __float_as_int(ldcg(P.route + j));
        wt[j] = ldcg(P.route + 8 + j);
    }
    const int KC = MOE_I / 32;
    for (int task = blockIdx.x; task < HDC_D / 16; task += gridDim.x) {
        int n0 = task * 16;
        MatTile m[9];
#pragma unroll
        for (int j = 0; j < 8; j++)
            m[j] = mat_tile(L.down, sel[j], n0, xs + j * KC * HDC_XS_STRIDE);
        m[8] = mat_tile(L.sdown, 0, n0, xs + 8 * KC * HDC_XS_STRIDE);
        gemv_tile<16, 9>(m, KC, red, out);
        if (threadIdx.x < 16) {
            int n = n0 + threadIdx.x;
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc = fmaf(out[j * 16 + threadIdx.x], wt[j], acc);
            float t = bfr(acc + out[8 * 16 + threadIdx.x]);
            float hn = bfr(ldcg(P.h + n) + t);
            P.h[n] = hn;
            if (last)
                P.hout[n] = f2bf(hn);
        }
    }
}

#endif
