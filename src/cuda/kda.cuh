/* kda.cuh - the phases of a Kimi delta attention layer. */
#ifndef HD_CUDA_KDA_CUH
#define HD_CUDA_KDA_CUH

#include "gemv.cuh"

/* The first GEMV of this CTA in the projection phase (its maps; 0: none),
 * exactly as kda_proj calls it, for gemv_prime. */
__device__ __forceinline__ int kda_proj_tiles(const LayerDev &L, MatTile *m, int &NB, int &K)
{
    NB = 2;
    K = HDC_D;
    if (blockIdx.x >= HDC_A / 32)
        return 0;
    for (int j = 0; j < 4; j++)
        m[j] = mat_tile(L.p[j], 0, blockIdx.x * 32, sm_xb(), 1);
    return 4;
}

/* Phase 1: x = norm(h); q, k, v, g projections (tiles of 32 columns of all
 * four, 128 tasks) with the short convolution, its cache shift, silu and
 * the decay in the epilogue; task 128 computes the 32 betas. */
__device__ __noinline__ void kda_proj(const StepParams &P, const LayerDev &L, bool first,
                         float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    layer_norm_in(P, L.attn_norm, first, xs, sm + SM_MISC,
                  [&] { gemv_prime_late<4>(P.late_prime & 1, L, kda_proj_tiles); });
    uint16_t *conv = P.conv[L.slot];
    unsigned long long *tr = layer_trace(P, L);
    trace_mark(tr, 12);
    for (int task = blockIdx.x; task <= HDC_A / 32; task += gridDim.x) {
        if (task == HDC_A / 32) {
            int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
            for (int hh = w; hh < 32; hh += HDC_WARPS) {
                const uint16_t *b = L.beta + (size_t)hh * HDC_D;
                float s = 0.0f;
                for (int t = 0; t < HDC_D / 32; t++)
                    s += xs[t * HDC_XS_STRIDE + lane] * bf16f(b[t * 32 + lane]);
                s = warp_sum(s);
                if (lane == 0)
                    P.beta[hh] = 1.0f / (1.0f + expf(-bfr(s)));
            }
            if (P.use_flags)
                flag_signal(P.flags + HDC_FL_BETA);
            continue;
        }
        int n0 = task * 32;
        MatTile m[4] = {mat_tile(L.p[0], 0, n0, xb, 1), mat_tile(L.p[1], 0, n0, xb, 1),
                        mat_tile(L.p[2], 0, n0, xb, 1), mat_tile(L.p[3], 0, n0, xb, 1)};
        /* the epilogue's convolution state and weights do not depend on
         * the GEMV: their loads are in flight while it runs */
        const int j = threadIdx.x >> 5, n = n0 + (threadIdx.x & 31);
        uint16_t *c = conv + (size_t)(j < 3 ? j : 0) * 3 * HDC_A;
        uint2 cw = make_uint2(0u, 0u);
        uint16_t c0 = 0, c1 = 0, c2 = 0;
        if (threadIdx.x < 96) {
            cw = *reinterpret_cast<const uint2 *>(L.conv_w + ((size_t)j * HDC_A + n) * 4);
            c0 = c[n];
            c1 = c[HDC_A + n];
            c2 = c[2 * HDC_A + n];
        }
        trace_mark(tr, 32);
        gemv_tile<32, 4, HDC_D>(m, red, out);
        trace_mark(tr, 33);
        if (threadIdx.x < 128) {
            float p = bfr(out[threadIdx.x]);
            if (j < 3) {
                float y = __fmul_rn(bf16f(c0), __uint_as_float(cw.x << 16));
                y = __fadd_rn(y, __fmul_rn(bf16f(c1), __uint_as_float(cw.x & 0xffff0000u)));
                y = __fadd_rn(y, __fmul_rn(bf16f(c2), __uint_as_float(cw.y << 16)));
                y = __fadd_rn(y, __fmul_rn(p, __uint_as_float(cw.y & 0xffff0000u)));
                c[n] = c1;
                c[HDC_A + n] = c2;
                c[2 * HDC_A + n] = f2bf(p);
                P.act[j * HDC_A + n] = bfr(silu(y));
            } else {
                P.act[3 * HDC_A + n] = 1.0f / (1.0f + expf(p));
            }
        }
        /* head task / 4's columns of q, k, v and the decay are out */
        if (P.use_flags)
            flag_signal(P.flags + HDC_FL_HEAD + task / 4);
    }
}

/* The L2 prefetches of this CTA's share of the phases (thread 0 only). */
__device__ void kda_proj_prefetch(const LayerDev &L)
{
    for (int task = blockIdx.x; task < HDC_A / 32; task += gridDim.x)
        for (int j = 0; j < 4; j++)
            prefetch_cols(L.p[j], 0, task * 32, 32);
}

__device__ void kda_delta_prefetch(const StepParams &P, const LayerDev &L)
{
    float *S = P.S[L.slot];
    for (int task = blockIdx.x; task < 128; task += gridDim.x)
        if ((task & 3) == 0)
            l2_prefetch(S + (size_t)(task >> 2) * 128 * 128, 128 * 128 * 4);
}

__device__ void out_proj_prefetch(const QMat &o)
{
    for (int task = blockIdx.x; task < HDC_D / 16; task += gridDim.x)
        prefetch_cols(o, 0, task * 16, 16);
}

/* Phase 2: the delta rule, split by 32 value columns (128 tasks): thread
 * (warp w, lane v) holds S[k][v] for k = 8w .. 8w + 7.  With P.use_flags
 * no grid barrier precedes it: a task loads its part of the state, then
 * waits for its head's four projection tasks and the betas. */
__device__ __noinline__ void kda_delta(const StepParams &P, const LayerDev &L, float *sm)
{
    float *red = sm;           /* [16][32] */
    float *red2 = sm + 512;    /* [16][32] */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float q_scale = 0.08838834764831845f;
    float *Sbase = P.S[L.slot];
    for (int task = blockIdx.x; task < 128; task += gridDim.x) {
        int hh = task >> 2, v0 = (task & 3) * 32;
        float *S = Sbase + (size_t)hh * 128 * 128 + v0 + lane;
        float s[8], kk[8], qq[8];
        float pp = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int k = w * 8 + i;
            s[i] = S[(size_t)k * 128];
        }
        if (P.use_flags)
            flag_wait(P.flags + HDC_FL_HEAD + hh, 4u, P.flags + HDC_FL_BETA, 1u);
        /* beta through shared memory: one request a CTA instead of one a
         * warp on the line that every CTA reads */
        float *bsh = sm + 1024;
        if (threadIdx.x == 0)
            *bsh = ldcg(P.beta + hh);
        float vv = ldcg(P.act + 2 * HDC_A + hh * 128 + v0 + lane);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int k = hh * 128 + w * 8 + i;
            float dec = ldcg(P.act + 3 * HDC_A + k);
            kk[i] = ldcg(P.act + HDC_A + k);
            qq[i] = ldcg(P.act + k) * q_scale;
            s[i] = s[i] * dec;
            pp = fmaf(s[i], kk[i], pp);
        }
        red[w * 32 + lane] = pp;
        __syncthreads();
        float pred = 0.0f;
#pragma unroll
        for (int i = 0; i < HDC_WARPS; i++)
            pred += red[i * 32 + lane];
        const float beta = *bsh;
        float u = vv - pred, o = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s[i] = s[i] + (beta * kk[i]) * u;
            o = fmaf(s[i], qq[i], o);
            S[(size_t)(w * 8 + i) * 128] = s[i];
        }
        red2[w * 32 + lane] = o;
        __syncthreads();
        if (threadIdx.x < 32) {
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < HDC_WARPS; i++)
                t += red2[i * 32 + lane];
            P.attn[hh * 128 + v0 + lane] = bfr(t);
        }
        __syncthreads();
    }
}

/* The first (only) GEMV of this CTA in out_proj, for gemv_prime. */
__device__ __forceinline__ int out_proj_tiles(const QMat &o, MatTile *m, int &NB, int &K)
{
    const int t0 = blockIdx.x;
    NB = 1;
    K = HDC_A;
    if (t0 >= HDC_D / 16)
        return 0;
    const int nt = t0 + gridDim.x < HDC_D / 16 ? 2 : 1;
    m[0] = mat_tile(o, 0, t0 * 16, sm_xb(), 1);
    m[1] = mat_tile(o, 0, (nt > 1 ? t0 + gridDim.x : t0) * 16, sm_xb(), 1);
    return nt;
}

/* o_proj (K = 4096 -> 2304) and the residual: 144 tasks of 16 columns.
 * (Splitting K to balance the 144 tasks over 132 CTAs was slower: the
 * partial sums' round trips through L2 cost more than the imbalance.) */
__device__ __noinline__ void out_proj(const StepParams &P, const QMat &o, float *sm,
                                      unsigned long long *tr)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    if (blockIdx.x >= HDC_D / 16)
        return;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    load_xs<HDC_A>(P.attn, xs, 1, /* bf16 values */
                   [&] { gemv_prime_late<2>(P.late_prime & 8, o, out_proj_tiles); });
    trace_mark(tr, 34);
    /* a CTA's tasks (one or two) in one GEMV */
    for (int t0 = blockIdx.x; t0 < HDC_D / 16; t0 += 2 * gridDim.x) {
        const int nt = t0 + gridDim.x < HDC_D / 16 ? 2 : 1;
        MatTile m[2] = {mat_tile(o, 0, t0 * 16, xb, 1),
                        mat_tile(o, 0, (nt > 1 ? t0 + gridDim.x : t0) * 16, xb, 1)};
        /* the residual's load is in flight while the GEMV runs */
        const int i = threadIdx.x >> 4;
        const int n = (t0 + i * gridDim.x) * 16 + (threadIdx.x & 15);
        const float h0 = threadIdx.x < 16 * nt ? ldcg(P.h + n) : 0.0f;
        gemv_run(m, nt, 1, HDC_A, red, out);
        trace_mark(tr, 35);
        if (threadIdx.x < 16 * nt)
            P.h[n] = bfr(h0 + bfr(out[threadIdx.x]));
    }
}

#endif
