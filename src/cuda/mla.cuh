/* mla.cuh - the phases of a latent MLA layer: projections with RoPE and the
 * cache append, the absorbed query, flash-decoding attention over token
 * splits, and the merge of the splits with W_v. */
#ifndef HD_CUDA_MLA_CUH
#define HD_CUDA_MLA_CUH

#include "kda.cuh"

#define MLA_Q 6144   /* 32 heads x 192 */
#define MLA_KV 576   /* 512 latent + 64 rope */
#define MLA_TB 32    /* tokens per block of the attention */
#define MERGE_STATS 16384 /* floats: where the merge keeps split statistics */

/* RoPE of the pair (e, o) at rope index r, position pos: this thread's
 * half (odd = the second value). */
__device__ __forceinline__ float rope(float e, float o, int r, int pos, bool odd)
{
    float angle = (float)pos * expf(-logf(10000.0f) * (2.0f * (float)r / 64.0f));
    float co = cosf(angle), si = sinf(angle);
    return odd ? __fadd_rn(__fmul_rn(o, co), __fmul_rn(e, si))
               : __fsub_rn(__fmul_rn(e, co), __fmul_rn(o, si));
}

/* Phase 1: q = bf(x q_proj) with RoPE (192 tiles), kv = bf(x kv_a) appended
 * to the caches at row pos (18 tiles). */
__device__ __noinline__ void mla_proj(const StepParams &P, const LayerDev &L, bool first,
                         float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    rmsnorm_xs(P.h, first ? P.hin : nullptr, L.attn_norm, xs, sm + SM_MISC);
    if (first && blockIdx.x == 0)
        for (int i = threadIdx.x; i < HDC_D; i += HDC_THREADS)
            P.h[i] = bf16f(P.hin[i]);
    const int ntask = MLA_Q / 32 + MLA_KV / 32;
    for (int task = blockIdx.x; task < ntask; task += gridDim.x) {
        bool isq = task < MLA_Q / 32;
        int n0 = isq ? task * 32 : (task - MLA_Q / 32) * 32;
        MatTile m[1] = {mat_tile(isq ? L.p[0] : L.p[1], 0, n0, xs)};
        gemv_tile<32, 1>(m, HDC_D / 32, red, out);
        if (threadIdx.x < 32) {
            int t = threadIdx.x, n = n0 + t;
            float v = bfr(out[t]);
            if (isq) {
                int ph = n % 192;
                if (ph >= 128) {
                    float e = bfr(out[t & ~1]), o = bfr(out[t | 1]);
                    v = bfr(rope(e, o, (ph - 128) >> 1, P.pos, t & 1));
                }
                P.q[n] = v;
            } else if (n < 512) {
                P.ckv[L.slot][(size_t)P.pos * 512 + n] = f2bf(v);
            } else {
                float e = bfr(out[t & ~1]), o = bfr(out[t | 1]);
                P.krope[L.slot][(size_t)P.pos * 64 + (n - 512)] =
                    f2bf(rope(e, o, (n - 512) >> 1, P.pos, t & 1));
            }
        }
    }
}

/* Phase 2: ql_h = W_k,h q_nope,h for each head (32 tasks).  Thread (column
 * n = tid % 128, group g = tid / 128) takes chunks 4g .. 4g + 3 of the 16;
 * each warp sums its 32 columns' products by a transposing butterfly. */
__device__ __noinline__ void mla_absorb(const StepParams &P, const LayerDev &L, float *sm)
{
    const QMat &kvb = L.p[2];
    float *red = sm; /* [16 chunks][4 warps][32] */
    const int n = threadIdx.x & 127, g = threadIdx.x >> 7;
    const int wq = n >> 5, lane = threadIdx.x & 31;
    for (int hh = blockIdx.x; hh < 32; hh += gridDim.x) {
        int col = hh * 256 + n;
        float qn = ldcg(P.q + hh * 192 + n);
        uint32_t sz = __ldg(kvb.sz + (size_t)g * kvb.N + col);
        float scale = __uint_as_float(sz << 16), zero = __uint_as_float(sz & 0xffff0000u);
        uint4 qw[4];
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
            qw[cc] = ld_stream(kvb.w + (size_t)(g * 4 + cc) * kvb.N + col);
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            float v[32];
            uint32_t words[4] = {qw[cc].x, qw[cc].y, qw[cc].z, qw[cc].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t lo = words[i] & 0x0F0F0F0Fu, hi = (words[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    v[i * 8 + b] = bfr((nib(lo, b) - zero) * scale) * qn;
                    v[i * 8 + 4 + b] = bfr((nib(hi, b) - zero) * scale) * qn;
                }
            }
#pragma unroll
            for (int s = 16; s >= 1; s >>= 1) {
                bool up = (lane & s) != 0;
#pragma unroll
                for (int i = 0; i < s; i++) {
                    float send = up ? v[i] : v[i + s];
                    float keep = up ? v[i + s] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, s);
                }
            }
            red[((g * 4 + cc) * 4 + wq) * 32 + lane] = v[0];
        }
        __syncthreads();
        {
            int k = threadIdx.x; /* 512 threads, 512 latent dims */
            int c = k >> 5, l = k & 31;
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++)
                t += red[(c * 4 + i) * 32 + l];
            P.ql[hh * 512 + k] = t;
        }
        __syncthreads();
    }
}

/* Phase 3: attention over this CTA's split of the pos + 1 tokens, all 32
 * heads at once, in blocks of 32 tokens (online softmax); writes the split's
 * (acc[512], max, sum) per head.  A CTA whose split is empty writes
 * nothing; the merge skips it. */
#define AT_C 0
#define AT_RED (MLA_TB * MLA_KV)
#define AT_SC (AT_RED + HDC_WARPS * MLA_TB * 32)
#define AT_AL (AT_SC + MLA_TB * 32)
__device__ __noinline__ void mla_attend(const StepParams &P, const LayerDev &L, float *sm)
{
    const int T = P.pos + 1;
    const int s = blockIdx.x;
    if (s >= P.nsplit)
        return;
    const int t0 = s * P.split_len, t1 = min(T, t0 + P.split_len);
    if (t0 >= t1)
        return;
    const float score_scale = 0.07216878364870322f;
    const uint16_t *ckv = P.ckv[L.slot], *kr = P.krope[L.slot];
    float *cb = sm + AT_C, *red = sm + AT_RED, *sc = sm + AT_SC, *al = sm + AT_AL;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;

    /* This warp's 36 dimensions of head `lane`'s query, in registers. */
    float qv[36];
#pragma unroll
    for (int j = 0; j < 36; j++) {
        int d = w * 36 + j;
        qv[j] = d < 512 ? ldcg(P.ql + lane * 512 + d)
                        : ldcg(P.q + lane * 192 + 128 + (d - 512));
    }
    const int hg = threadIdx.x >> 6, ds = threadIdx.x & 63;
    float acc[4][8];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
            acc[a][b] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; /* threads < 32: head tid */

    for (int tb = t0; tb < t1; tb += MLA_TB) {
        const int nt = min(MLA_TB, t1 - tb);
        /* a. the block's rows as fp32: 64 + 8 pieces of 8 values a token,
         * all of a thread's loads in flight at once */
        {
            uint4 v[5];
#pragma unroll
            for (int u = 0; u < 5; u++) {
                int i = threadIdx.x + u * HDC_THREADS;
                if (i < nt * 72) {
                    int t = i / 72, pc = i % 72;
                    const uint4 *src = pc < 64
                        ? reinterpret_cast<const uint4 *>(ckv + (size_t)(tb + t) * 512) + pc
                        : reinterpret_cast<const uint4 *>(kr + (size_t)(tb + t) * 64) + (pc - 64);
                    v[u] = __ldcg(src);
                }
            }
#pragma unroll
            for (int u = 0; u < 5; u++) {
                int i = threadIdx.x + u * HDC_THREADS;
                if (i < nt * 72) {
                    float *dst = cb + (i / 72) * MLA_KV + (i % 72) * 8;
                    uint32_t wv[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        dst[2 * k] = __uint_as_float(wv[k] << 16);
                        dst[2 * k + 1] = __uint_as_float(wv[k] & 0xffff0000u);
                    }
                }
            }
        }
        __syncthreads();
        /* b. partial scores over this warp's 36 dimensions */
        for (int t = 0; t < nt; t++) {
            const float4 *c4 = reinterpret_cast<const float4 *>(cb + t * MLA_KV + w * 36);
            float p = 0.0f;
#pragma unroll
            for (int j = 0; j < 9; j++) {
                float4 c = c4[j];
                p = fmaf(qv[4 * j], c.x, p);
                p = fmaf(qv[4 * j + 1], c.y, p);
                p = fmaf(qv[4 * j + 2], c.z, p);
                p = fmaf(qv[4 * j + 3], c.w, p);
            }
            red[(w * MLA_TB + t) * 32 + lane] = p;
        }
        __syncthreads();
        /* c. scores[t][h] */
        for (int o = threadIdx.x; o < nt * 32; o += HDC_THREADS) {
            int t = o >> 5, hh = o & 31;
            float v = 0.0f;
#pragma unroll
            for (int i = 0; i < HDC_WARPS; i++)
                v += red[(i * MLA_TB + t) * 32 + hh];
            sc[t * 32 + hh] = v * score_scale;
        }
        __syncthreads();
        /* d. online softmax statistics, one thread a head */
        if (threadIdx.x < 32) {
            int hh = threadIdx.x;
            float mb = m_run;
            for (int t = 0; t < nt; t++)
                mb = fmaxf(mb, sc[t * 32 + hh]);
            float alpha = m_run == -INFINITY ? 0.0f : expf(m_run - mb);
            float sum = 0.0f;
            for (int t = 0; t < nt; t++) {
                float p = mb == -INFINITY ? 0.0f : expf(sc[t * 32 + hh] - mb);
                sc[t * 32 + hh] = p;
                sum += p;
            }
            l_run = l_run * alpha + sum;
            m_run = mb;
            al[hh] = alpha;
        }
        __syncthreads();
        /* e. acc[h][d] = acc * alpha + sum_t p[t][h] c[t][d] */
#pragma unroll
        for (int a = 0; a < 4; a++) {
            float f = al[hg * 4 + a];
#pragma unroll
            for (int b = 0; b < 8; b++)
                acc[a][b] *= f;
        }
        for (int t = 0; t < nt; t++) {
            float4 p4 = *reinterpret_cast<const float4 *>(sc + t * 32 + hg * 4);
            float4 ca = *reinterpret_cast<const float4 *>(cb + t * MLA_KV + ds * 8);
            float4 cc = *reinterpret_cast<const float4 *>(cb + t * MLA_KV + ds * 8 + 4);
            float pv[4] = {p4.x, p4.y, p4.z, p4.w};
            float cv[8] = {ca.x, ca.y, ca.z, ca.w, cc.x, cc.y, cc.z, cc.w};
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 8; b++)
                    acc[a][b] = fmaf(pv[a], cv[b], acc[a][b]);
        }
        __syncthreads();
    }
    float *part = P.parts + (size_t)s * 32 * HDC_PART;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        float4 *dst = reinterpret_cast<float4 *>(part + (hg * 4 + a) * HDC_PART + ds * 8);
        dst[0] = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
        dst[1] = make_float4(acc[a][4], acc[a][5], acc[a][6], acc[a][7]);
    }
    if (threadIdx.x < 32) {
        part[threadIdx.x * HDC_PART + 512] = m_run;
        part[threadIdx.x * HDC_PART + 513] = l_run;
    }
}

/* Phase 4: per head (32 tasks) merge the splits into lat_h, then
 * o_h = bf(W_v,h^T lat_h): 4 tiles of 32 columns of kv_b, K = 512. */
__device__ __noinline__ void mla_merge(const StepParams &P, const LayerDev &L, float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    const int T = P.pos + 1;
    for (int hh = blockIdx.x; hh < 32; hh += gridDim.x) {
        /* The splits' statistics, loaded in parallel, then their weights. */
        float *st_m = sm + MERGE_STATS, *st_l = st_m + 1024;
        int ns = 0;
        while (ns < P.nsplit && ns < 1024 && ns * P.split_len < T)
            ns++;
        for (int s = threadIdx.x; s < ns; s += HDC_THREADS) {
            st_m[s] = ldcg(P.parts + ((size_t)s * 32 + hh) * HDC_PART + 512);
            st_l[s] = ldcg(P.parts + ((size_t)s * 32 + hh) * HDC_PART + 513);
        }
        __syncthreads();
        float M = -INFINITY;
        for (int s = 0; s < ns; s++)
            M = fmaxf(M, st_m[s]);
        float num = 0.0f, den = 0.0f;
        const int d = threadIdx.x;
        int s = 0;
        for (; s + 4 <= ns; s += 4) {
            float a[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                a[u] = ldcg(P.parts + ((size_t)(s + u) * 32 + hh) * HDC_PART + d);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float m = st_m[s + u];
                float e = m == -INFINITY ? 0.0f : expf(m - M);
                den += e * st_l[s + u];
                num += e * a[u];
            }
        }
        for (; s < ns; s++) {
            float m = st_m[s];
            float e = m == -INFINITY ? 0.0f : expf(m - M);
            den += e * st_l[s];
            num += e * ldcg(P.parts + ((size_t)s * 32 + hh) * HDC_PART + d);
        }
        xs[(d >> 5) * HDC_XS_STRIDE + (d & 31)] = num / den;
        xs_chunk_sums(xs, 512);
        int c0 = hh * 256 + 128;
        MatTile m[4] = {mat_tile(L.p[2], 0, c0, xs), mat_tile(L.p[2], 0, c0 + 32, xs),
                        mat_tile(L.p[2], 0, c0 + 64, xs), mat_tile(L.p[2], 0, c0 + 96, xs)};
        gemv_tile<32, 4>(m, 512 / 32, red, out);
        if (threadIdx.x < 128)
            P.attn[hh * 128 + threadIdx.x] = bfr(out[threadIdx.x]);
    }
}

#endif
