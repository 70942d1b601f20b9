/* mla.cuh - the phases of a latent MLA layer: projections with RoPE and the
 * cache append, the absorbed query, flash-decoding attention over token
 * splits, and the merge of the splits with W_v. */
#ifndef HD_CUDA_MLA_CUH
#define HD_CUDA_MLA_CUH

#include "kda.cuh"

#define MLA_Q 6144   /* 32 heads x 192 */
#define MLA_KV 576   /* 512 latent + 64 rope */
#define MLA_TB 32    /* tokens per block of the attention */

/* RoPE of the pair (e, o) at rope index r, position pos: this thread's
 * half (odd = the second value). */
__device__ __forceinline__ float rope(float e, float o, int r, int pos, bool odd)
{
    float angle = (float)pos * expf(-logf(10000.0f) * (2.0f * (float)r / 64.0f));
    float co = cosf(angle), si = sinf(angle);
    return odd ? __fadd_rn(__fmul_rn(o, co), __fmul_rn(e, si))
               : __fsub_rn(__fmul_rn(e, co), __fmul_rn(o, si));
}

/* The first (only) GEMV of this CTA in mla_proj, for gemv_prime. */
__device__ __forceinline__ int mla_proj_tiles(const LayerDev &L, MatTile *m, int &NB, int &K)
{
    const int ntask = MLA_Q / 32 + MLA_KV / 32, t0 = blockIdx.x;
    NB = 2;
    K = HDC_D;
    if (t0 >= ntask)
        return 0;
    const int nt = t0 + gridDim.x < ntask ? 2 : 1;
    for (int i = 0; i < 2; i++) {
        const int task = i < nt ? t0 + i * gridDim.x : t0;
        const bool isq = task < MLA_Q / 32;
        m[i] = mat_tile(isq ? L.p[0] : L.p[1], 0, isq ? task * 32 : (task - MLA_Q / 32) * 32,
                        sm_xb(), 1);
    }
    return nt;
}

/* Phase 1: q = bf(x q_proj) with RoPE (192 tiles), kv = bf(x kv_a) appended
 * to the caches at row pos (18 tiles). */
__device__ __noinline__ void mla_proj(const StepParams &P, const LayerDev &L, bool first,
                         float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    const int ntask = MLA_Q / 32 + MLA_KV / 32;
    layer_norm_in(P, L.attn_norm, first, xs, sm + SM_MISC,
                  [&] { gemv_prime_late<2>(P.late_prime & 2, L, mla_proj_tiles); });
    /* a CTA's tasks (one or two) in one GEMV */
    for (int t0 = blockIdx.x; t0 < ntask; t0 += 2 * gridDim.x) {
        const int nt = t0 + gridDim.x < ntask ? 2 : 1;
        MatTile m[2];
        for (int i = 0; i < 2; i++) {
            const int task = i < nt ? t0 + i * gridDim.x : t0;
            const bool isq = task < MLA_Q / 32;
            m[i] = mat_tile(isq ? L.p[0] : L.p[1], 0,
                            isq ? task * 32 : (task - MLA_Q / 32) * 32, xb, 1);
        }
        gemv_run(m, nt, 2, HDC_D, red, out);
        if (threadIdx.x < 32 * nt) {
            const int i = threadIdx.x >> 5, t = threadIdx.x & 31;
            const float *o32 = out + 32 * i;
            const int task = t0 + i * gridDim.x;
            const bool isq = task < MLA_Q / 32;
            const int n = (isq ? task * 32 : (task - MLA_Q / 32) * 32) + t;
            float v = bfr(o32[t]);
            if (isq) {
                int ph = n % 192;
                if (ph >= 128) {
                    float e = bfr(o32[t & ~1]), o = bfr(o32[t | 1]);
                    v = bfr(rope(e, o, (ph - 128) >> 1, P.pos, t & 1));
                }
                P.q[n] = v;
            } else if (n < 512) {
                P.ckv[L.slot][(size_t)P.pos * 512 + n] = f2bf(v);
            } else {
                float e = bfr(o32[t & ~1]), o = bfr(o32[t | 1]);
                P.krope[L.slot][(size_t)P.pos * 64 + (n - 512)] =
                    f2bf(rope(e, o, (n - 512) >> 1, P.pos, t & 1));
            }
        }
    }
}

__device__ __forceinline__ uint32_t movtrans(uint32_t a)
{
    uint32_t d;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

/* Phase 2: ql_h = W_k,h q_nope,h for each head: the product runs over the
 * columns of kv_b, so each dequantized 16 x 16 fragment is transposed
 * (movmatrix) before the mma.  A warp takes one head and 64 of the 512
 * latent rows (256 warp tasks over the grid): 8 units of 16 columns, all
 * loads in flight at once; q_nope enters as hi + mid + lo like x. */
__device__ __noinline__ void mla_absorb(const StepParams &P, const LayerDev &L, float *sm)
{
    (void)sm;
    const QMat &kvb = L.p[2];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    for (int task = w * gridDim.x + blockIdx.x; task < 256;
         task += gridDim.x * HDC_WARPS) {
        const int hh = task >> 3, kb = task & 7;
        uint4 q[8];
        uint2 za[8], zb[8], bq[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int nb = hh * 16 + i;
            q[i] = ld_stream(kvb.w + ((size_t)nb * 8 + kb) * 32 + lane);
            const uint2 *sp = kvb.sz + ((size_t)nb * 4 + (kb >> 1)) * 16 + g;
            za[i] = __ldg(sp);
            zb[i] = __ldg(sp + 8);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            bq[i] = make_uint2(0u, 0u);
            if (lane < 12) {
                const float *qp = P.q + hh * 192 + 16 * i + 2 * tq;
                bq[i] = make_uint2(bf2_pack(bf_part(ldcg(qp), g), bf_part(ldcg(qp + 1), g)),
                                   bf2_pack(bf_part(ldcg(qp + 8), g), bf_part(ldcg(qp + 9), g)));
            }
        }
        float acc[4][4];
#pragma unroll
        for (int st = 0; st < 4; st++)
            acc[st][0] = acc[st][1] = acc[st][2] = acc[st][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const Deq a = deq_consts(za[i]), b = deq_consts(zb[i]);
            const uint32_t words[4] = {q[i].x, q[i].y, q[i].z, q[i].w};
#pragma unroll
            for (int st = 0; st < 4; st++) {
                uint32_t v = words[st];
                /* rows: columns n of kv_b; after the transposes: latent rows */
                uint32_t r0 = movtrans(deq(v, a.c1, a.s2, a.c2));
                uint32_t r1 = movtrans(deq(v >> 4, b.c1, b.s2, b.c2));
                uint32_t r2 = movtrans(deq(v >> 8, a.c1, a.s2, a.c2));
                uint32_t r3 = movtrans(deq(v >> 12, b.c1, b.s2, b.c2));
                mma_bf16(acc[st], r0, r2, r1, r3, bq[i].x, bq[i].y);
            }
        }
#pragma unroll
        for (int st = 0; st < 4; st++) {
            float lo0 = __shfl_down_sync(0xffffffffu, acc[st][0], 1);
            float lo2 = __shfl_down_sync(0xffffffffu, acc[st][2], 1);
            if (tq == 0) {
                float *o = P.ql + hh * 512 + kb * 64 + 16 * st + g;
                o[0] = (acc[st][0] + acc[st][1]) + lo0;
                o[8] = (acc[st][2] + acc[st][3]) + lo2;
            }
        }
    }
}

__device__ void mla_proj_prefetch(const LayerDev &L)
{
    for (int task = blockIdx.x; task < MLA_Q / 32 + MLA_KV / 32; task += gridDim.x) {
        bool isq = task < MLA_Q / 32;
        prefetch_cols(isq ? L.p[0] : L.p[1], 0,
                      isq ? task * 32 : (task - MLA_Q / 32) * 32, 32);
    }
}

/* W_k for the absorb's warp tasks of this CTA, W_v for its merge. */
__device__ void mla_kvb_prefetch(const LayerDev &L)
{
    const QMat &kvb = L.p[2];
    for (int w = 0; w < HDC_WARPS; w++) {
        int task = w * gridDim.x + blockIdx.x;
        if (task >= 256)
            break;
        int hh = task >> 3, kb = task & 7;
        for (int i = 0; i < 8; i++)
            l2_prefetch(kvb.w + ((size_t)(hh * 16 + i) * 8 + kb) * 32, 512);
        if (kb == 0) /* the head's W_k constants: 8 blocks x 4 groups */
            l2_prefetch(kvb.sz + (size_t)hh * 16 * 4 * 16, 8 * 4 * 128);
    }
    for (int hh = blockIdx.x; hh < 32; hh += gridDim.x)
        prefetch_cols(kvb, 0, hh * 256 + 128, 128);
}

/* This CTA's split of the pos + 1 tokens, [t0, t1); false when it has
 * none (the merge skips it). */
__device__ __forceinline__ bool attend_split(const StepParams &P, int &t0, int &t1)
{
    if ((int)blockIdx.x >= P.nsplit)
        return false;
    t0 = blockIdx.x * P.split_len;
    t1 = min(P.pos + 1, t0 + P.split_len);
    return t0 < t1;
}

/* L2 prefetch of the cache rows [ta, tb) of a split (the latent rows and
 * the rope rows: two runs), issued by one thread. */
__device__ __forceinline__ void attend_prefetch(const uint16_t *ckv, const uint16_t *kr, int ta,
                                                int tb)
{
    if (tb > ta) {
        l2_prefetch(ckv + (size_t)ta * 512, (uint32_t)(tb - ta) * 1024u);
        l2_prefetch(kr + (size_t)ta * 64, (uint32_t)(tb - ta) * 128u);
    }
}

/* The online softmax statistics of a block for H heads (32, or 8 in
 * mla_attend_tc8), on every warp: thread (q, l) (warp q, lane l) holds
 * some of head hh = l % H's scores, their maximum lm (with H < 32, the
 * lanes l, l + H, ... hold other scores of the same head and are first
 * combined by shuffles).  softmax_max: the block's maximum of head hh
 * with the running one (mrun), through red in a fixed order.
 * softmax_commit, once the thread has its sum ps of exp(score - mb):
 * alpha = exp(old max - mb) into al, and on threads < H the running sum
 * l_run and mrun.  red and red2: 16 x H floats each, distinct (red is
 * still read when red2 is written).  Both contain a __syncthreads. */
template <int H>
__device__ __forceinline__ float softmax_max(float lm, float *red, const float *mrun)
{
    const int lane = threadIdx.x & 31, hh = lane % H, q = threadIdx.x >> 5;
#pragma unroll
    for (int o = H; o < 32; o <<= 1)
        lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, o));
    if (lane < H)
        red[q * H + hh] = lm;
    __syncthreads();
    float mb = mrun[hh];
#pragma unroll 4
    for (int i = 0; i < HDC_WARPS; i++)
        mb = fmaxf(mb, red[i * H + hh]);
    return mb;
}

template <int H>
__device__ __forceinline__ void softmax_commit(float ps, float mb, float *red2, float *al,
                                               float *mrun, float &l_run)
{
    const int lane = threadIdx.x & 31, hh = lane % H, q = threadIdx.x >> 5;
#pragma unroll
    for (int o = H; o < 32; o <<= 1)
        ps += __shfl_xor_sync(0xffffffffu, ps, o);
    if (lane < H)
        red2[q * H + hh] = ps;
    if (threadIdx.x < H)
        al[hh] = mrun[hh] == -INFINITY ? 0.0f : expf(mrun[hh] - mb);
    __syncthreads();
    if (threadIdx.x < H) {
        float sum = 0.0f;
#pragma unroll 4
        for (int i = 0; i < HDC_WARPS; i++)
            sum += red2[i * H + hh];
        l_run = l_run * al[hh] + sum;
        mrun[hh] = mb; /* read again only after the next block's barriers */
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
#define AT_Q (AT_AL + 64)
#define AT_QROW (MLA_KV + 1)
static_assert((AT_Q + 32 * AT_QROW) * 4 <= GEMV_BAR_OFF, "attention smem map");
__device__ __noinline__ void mla_attend(const StepParams &P, const LayerDev &L, float *sm,
                                        unsigned long long *tr)
{
    const int s = blockIdx.x;
    int t0, t1;
    if (!attend_split(P, t0, t1))
        return;
    const float score_scale = 0.07216878364870322f;
    const uint16_t *ckv = P.ckv[L.slot], *kr = P.krope[L.slot];
    float *cb = sm + AT_C, *red = sm + AT_RED, *sc = sm + AT_SC, *al = sm + AT_AL;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0)
        attend_prefetch(ckv, kr, t0 + MLA_TB, t1);

    /* The 32 x 576 query values in shared memory, rows of 577 floats so
     * that a warp's 32 lanes (32 heads) read 32 different banks; loaded in
     * 16-byte pieces in the order they lie in L2 (read per warp straight
     * from L2, a load would touch 32 lines, one per head).  Step b reads
     * this warp's 36 dimensions of head `lane` again for every block, so
     * that they do not hold 36 registers through the whole loop. */
    {
        float *qs = sm + AT_Q;
#pragma unroll
        for (int u = 0; u < 32 * 512 / 4 / HDC_THREADS; u++) {
            const int i = threadIdx.x + u * HDC_THREADS, hh = i >> 7, d = (i & 127) * 4;
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(P.ql) + i);
            float *dst = qs + hh * AT_QROW + d;
            dst[0] = v.x;
            dst[1] = v.y;
            dst[2] = v.z;
            dst[3] = v.w;
        }
        {
            const int hh = threadIdx.x >> 4, d = (threadIdx.x & 15) * 4;
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(P.q + hh * 192 + 128 + d));
            float *dst = qs + hh * AT_QROW + 512 + d;
            dst[0] = v.x;
            dst[1] = v.y;
            dst[2] = v.z;
            dst[3] = v.w;
        }
    }
    const uint32_t qa = smem_addr(sm + AT_Q + lane * AT_QROW + w * 36);
    const int hg = threadIdx.x >> 6, ds = threadIdx.x & 63;
    float acc[4][8];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
            acc[a][b] = 0.0f;
    float l_run = 0.0f;                    /* threads < 32: head tid */
    float *mrun = al + 32;                 /* m_run of every head, shared */
    if (threadIdx.x < 32)
        mrun[threadIdx.x] = -INFINITY;

    for (int tb = t0; tb < t1; tb += MLA_TB) {
        const int nt = min(MLA_TB, t1 - tb);
        /* a. the block's rows as fp32: 64 + 8 pieces of 8 values a token,
         * copied raw into red (free until step b) with cp.async, so that no
         * register waits on DRAM (as loads into registers, the compiler
         * spilled them: one DRAM round trip a piece), then widened into cb */
        {
            const uint32_t raw = smem_addr(red);
            for (int i = threadIdx.x; i < nt * 72; i += HDC_THREADS) {
                const int t = i / 72, pc = i % 72;
                const uint16_t *src = pc < 64 ? ckv + (size_t)(tb + t) * 512 + pc * 8
                                              : kr + (size_t)(tb + t) * 64 + (pc - 64) * 8;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             : : "r"(raw + (uint32_t)i * 16u), "l"(src) : "memory");
            }
            asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" : : : "memory");
            __syncthreads();
            for (int i = threadIdx.x; i < nt * 72; i += HDC_THREADS) {
                const uint4 v = reinterpret_cast<const uint4 *>(red)[i];
                float4 *dst = reinterpret_cast<float4 *>(cb + (i / 72) * MLA_KV + (i % 72) * 8);
                dst[0] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                     __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
                dst[1] = make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                                     __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
            }
        }
        __syncthreads();
        if (tb == t0)
            trace_mark(tr, 25); /* the first block in shared memory */
        /* b. partial scores over this warp's 36 dimensions */
        float qv[36];
#pragma unroll
        for (int j = 0; j < 36; j++)
            qv[j] = lds32f(qa + 4 * j);
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
        /* d. online softmax statistics: thread (q, hh) takes the tokens q
         * and q + 16 of head hh; red is free after c */
        {
            const int hh = lane, q = w;
            const bool t0ok = q < nt, t1ok = q + 16 < nt;
            float lm = -INFINITY;
            if (t0ok)
                lm = sc[q * 32 + hh];
            if (t1ok)
                lm = fmaxf(lm, sc[(q + 16) * 32 + hh]);
            const float mb = softmax_max<32>(lm, red, mrun);
            float ps = 0.0f;
            if (t0ok) {
                float p = mb == -INFINITY ? 0.0f : expf(sc[q * 32 + hh] - mb);
                sc[q * 32 + hh] = p;
                ps = p;
            }
            if (t1ok) {
                float p = mb == -INFINITY ? 0.0f : expf(sc[(q + 16) * 32 + hh] - mb);
                sc[(q + 16) * 32 + hh] = p;
                ps += p;
            }
            softmax_commit<32>(ps, mb, red + 512, al, mrun, l_run);
        }
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
    trace_mark(tr, 26);
    float *part = P.parts + (size_t)s * 32 * HDC_PART;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        float4 *dst = reinterpret_cast<float4 *>(part + (hg * 4 + a) * HDC_PART + ds * 8);
        dst[0] = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
        dst[1] = make_float4(acc[a][4], acc[a][5], acc[a][6], acc[a][7]);
    }
    if (threadIdx.x < 32) {
        part[threadIdx.x * HDC_PART + 512] = mrun[threadIdx.x];
        part[threadIdx.x * HDC_PART + 513] = l_run;
    }
}

/* Phase 3 on tensor cores (the default; HD_CUDA_ATTN=scalar selects
 * mla_attend above): the same partials, in blocks of 64 tokens.
 *
 * The cache block stays bf16 in shared memory (cp.async, rows padded to
 * 1168 bytes so that ldmatrix's 8 rows fall in different banks; rows past
 * the split's end are zero-filled).  The query enters as three bf16 parts
 * hi + mid + lo = q exactly, so every product is exact and the sums fp32,
 * as in the GEMV:
 *   scores: [64 tokens x 576] x [576 x 32 heads], warp w a 16 x 8 tile
 *           (tokens 16 (w / 4), heads 8 (w % 4)), the three parts in three
 *           accumulators added at the end;
 *   values: [32 heads x 64 tokens] x [64 x 512], the probabilities p split
 *           the same way, warp w heads 16 (w % 2) and dimensions 64 (w / 2),
 *           8 accumulator tiles that carry over the blocks (online softmax).
 * Smem map in bytes: cache block, query parts, scores, p parts, stats. */
#define TC_TB 64
#define TC_ROW 1168 /* bytes a cache or query row: 576 bf16 + 16 */
#define TC_BLOCK (TC_TB * TC_ROW) /* bytes of a cache block in shared memory */
#define TC_KC 0
#define TC_QP (TC_KC + TC_BLOCK)
#define TC_SC (TC_QP + 3 * 32 * TC_ROW)
#define TC_PROW 144 /* bytes a row of p: 64 bf16 + 16 */
#define TC_PP (TC_SC + TC_TB * 32 * 4)
#define TC_RED (TC_PP + 3 * 32 * TC_PROW)
#define TC_AL (TC_RED + 2 * HDC_WARPS * 32 * 4)
#define TC_END (TC_AL + 64 * 4)
static_assert(TC_END <= GEMV_BAR_OFF, "tensor-core attention smem map");

__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t a, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

/* The four values f as three bf16 parts each (hi + mid + lo = f
 * exactly): hi at q[0..3], mid ps elements on, lo 2 ps on. */
__device__ __forceinline__ void store_parts3(uint16_t *q, const float4 v, int ps)
{
    const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const float hi = bfr(f[c]), mid = bfr(f[c] - hi), lo = bfr((f[c] - hi) - mid);
        q[c] = f2bf(hi);
        q[ps + c] = f2bf(mid);
        q[2 * ps + c] = f2bf(lo);
    }
}

/* The cache rows [tb, tb + nt) into shared memory at kc (rows of TC_ROW
 * bytes, the 512 latent then the 64 rope values), TC_TB rows, those past
 * nt zero: 72 pieces of 16 bytes a token, cp.async by every thread
 * (committed and waited for by the caller). */
__device__ __forceinline__ void attend_copy_block(uint32_t kc, const uint16_t *ckv,
                                                  const uint16_t *kr, int tb, int nt)
{
    for (int i = threadIdx.x; i < TC_TB * 72; i += HDC_THREADS) {
        const int t = i / 72, pc = i % 72;
        const int tt = t < nt ? tb + t : tb;
        const uint16_t *src = pc < 64 ? ckv + (size_t)tt * 512 + pc * 8
                                      : kr + (size_t)tt * 64 + (pc - 64) * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     : : "r"(kc + t * TC_ROW + pc * 16), "l"(src), "r"(t < nt ? 16 : 0)
                     : "memory");
    }
}

__device__ __noinline__ void mla_attend_tc(const StepParams &P, const LayerDev &L, float *sm,
                                           unsigned long long *tr)
{
    const int s = blockIdx.x;
    int t0, t1;
    if (!attend_split(P, t0, t1))
        return;
    const float score_scale = 0.07216878364870322f;
    const uint16_t *ckv = P.ckv[L.slot], *kr = P.krope[L.slot];
    char *sb = reinterpret_cast<char *>(sm);
    const uint32_t base = smem_addr(sm);
    float *sc = reinterpret_cast<float *>(sb + TC_SC);
    float *redm = reinterpret_cast<float *>(sb + TC_RED), *redl = redm + HDC_WARPS * 32;
    float *al = reinterpret_cast<float *>(sb + TC_AL), *mrun = al + 32;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;

    /* the query's three parts, [part][head][576]: every load of the
     * thread in flight at once (as a loop of 36 load-then-store rounds,
     * one L2 round trip each, this took 14.7 us at context 32768; device
     * call 1 of 2026-12-04's sixth session).  Thread i takes the 16-byte
     * pieces i + 512 u of the 32 x 128 pieces of ql and piece i of the 32
     * x 16 of q's rope part. */
    {
        float4 v[9];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = __ldcg(reinterpret_cast<const float4 *>(P.ql) + threadIdx.x + u * HDC_THREADS);
        v[8] = __ldcg(reinterpret_cast<const float4 *>(P.q + (threadIdx.x >> 4) * 192 + 128) +
                      (threadIdx.x & 15));
#pragma unroll
        for (int u = 0; u < 9; u++) {
            const int i = threadIdx.x + u * HDC_THREADS;
            const int hh = u < 8 ? i >> 7 : threadIdx.x >> 4;
            const int d = u < 8 ? (i & 127) * 4 : 512 + (threadIdx.x & 15) * 4;
            store_parts3(reinterpret_cast<uint16_t *>(sb + TC_QP + hh * TC_ROW) + d, v[u],
                         32 * TC_ROW / 2);
        }
    }
    trace_mark(tr, 40);
    if (threadIdx.x < 32)
        mrun[threadIdx.x] = -INFINITY;
    float l_run = 0.0f; /* threads < 32: head tid */

    /* values: this warp's 8 tiles (heads 16 mh .., dimensions 64 dg + 8 n ..) */
    const int mh = w & 1, dg = w >> 1;
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    /* scores: this warp's tile */
    const int mt = w >> 2, hn = w & 3;
    const uint32_t a_sc = base + TC_KC + (16 * mt + (lane & 15)) * TC_ROW + (lane >> 4) * 16;
    const uint32_t b_sc = base + TC_QP + (8 * hn + (lane & 7)) * TC_ROW + (lane >> 3) * 16;
    const uint32_t a_pv = base + TC_PP + (16 * mh + (lane & 15)) * TC_PROW + (lane >> 4) * 16;
    const uint32_t b_pv = base + TC_KC + ((lane & 7) + ((lane >> 3) & 1) * 8) * TC_ROW +
                          (64 * dg + (lane >> 4) * 8) * 2;

    for (int tb = t0; tb < t1; tb += TC_TB) {
        const int nt = min(TC_TB, t1 - tb);
        /* a. the block */
        attend_copy_block(base + TC_KC, ckv, kr, tb, nt);
        if (tb == t0) {
            trace_mark(tr, 41);
            /* the rows past the first block into L2, behind its copies
             * (ahead of them and of the query's loads, the query took 8.8
             * instead of 4.2 us: device call 3 of 2026-12-04's sixth
             * session), so that the later blocks come from L2 */
            if (threadIdx.x == 0)
                attend_prefetch(ckv, kr, t0 + TC_TB, t1);
        }
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" : : : "memory");
        __syncthreads();
        if (tb == t0)
            trace_mark(tr, 25);
        /* b. scores of 16 tokens x 8 heads, 36 k-steps x 3 parts */
        {
            float d[3][4];
#pragma unroll
            for (int p = 0; p < 3; p++)
                d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.0f;
#pragma unroll 2
            for (int k2 = 0; k2 < MLA_KV / 32; k2++) {
                uint32_t a0[4], a1[4];
                ldsm_x4(a_sc + k2 * 64, a0);
                ldsm_x4(a_sc + k2 * 64 + 32, a1);
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    uint32_t b[4];
                    ldsm_x4(b_sc + p * 32 * TC_ROW + k2 * 64, b);
                    mma_bf16(d[p], a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
                    mma_bf16(d[p], a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = 16 * mt + g + (i >> 1) * 8, hh = 8 * hn + 2 * tq + (i & 1);
                const float v = ((d[0][i] + d[1][i]) + d[2][i]) * score_scale;
                sc[t * 32 + hh] = t < nt ? v : -INFINITY;
            }
        }
        __syncthreads();
        if (tb == t0)
            trace_mark(tr, 42);
        /* c. online softmax statistics: thread (q, hh) takes the tokens
         * q + 16 i of head hh; p into its three bf16 parts [part][head][t] */
        {
            const int hh = lane, q = w;
            float lm = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; i++)
                lm = fmaxf(lm, sc[(q + 16 * i) * 32 + hh]);
            const float mb = softmax_max<32>(lm, redm, mrun);
            float ps = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = q + 16 * i;
                const float sv = sc[t * 32 + hh];
                const float p = (mb == -INFINITY || sv == -INFINITY) ? 0.0f : expf(sv - mb);
                ps += p;
                const float hi = bfr(p), mid = bfr(p - hi), lo = bfr((p - hi) - mid);
                uint16_t *pp = reinterpret_cast<uint16_t *>(sb + TC_PP + hh * TC_PROW) + t;
                pp[0] = f2bf(hi);
                pp[32 * TC_PROW / 2] = f2bf(mid);
                pp[64 * TC_PROW / 2] = f2bf(lo);
            }
            softmax_commit<32>(ps, mb, redl, al, mrun, l_run);
        }
        if (tb == t0)
            trace_mark(tr, 43);
        /* d. acc = acc * alpha + p . c */
        {
            const float f0 = al[16 * mh + g], f1 = al[16 * mh + g + 8];
#pragma unroll
            for (int n = 0; n < 8; n++) {
                acc[n][0] *= f0;
                acc[n][1] *= f0;
                acc[n][2] *= f1;
                acc[n][3] *= f1;
            }
#pragma unroll
            for (int kt = 0; kt < TC_TB / 16; kt++) {
                uint32_t a[3][4];
#pragma unroll
                for (int p = 0; p < 3; p++)
                    ldsm_x4(a_pv + p * 32 * TC_PROW + kt * 32, a[p]);
#pragma unroll
                for (int n2 = 0; n2 < 4; n2++) {
                    uint32_t b[4];
                    ldsm_x4_t(b_pv + kt * 16 * TC_ROW + n2 * 32, b);
#pragma unroll
                    for (int p = 0; p < 3; p++) {
                        mma_bf16(acc[2 * n2], a[p][0], a[p][1], a[p][2], a[p][3], b[0], b[1]);
                        mma_bf16(acc[2 * n2 + 1], a[p][0], a[p][1], a[p][2], a[p][3], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
    }
    trace_mark(tr, 26);
    float *part = P.parts + (size_t)s * 32 * HDC_PART;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const int dd = 64 * dg + 8 * n + 2 * tq, h0 = 16 * mh + g;
        *reinterpret_cast<float2 *>(part + h0 * HDC_PART + dd) = make_float2(acc[n][0], acc[n][1]);
        *reinterpret_cast<float2 *>(part + (h0 + 8) * HDC_PART + dd) =
            make_float2(acc[n][2], acc[n][3]);
    }
    if (threadIdx.x < 32) {
        part[threadIdx.x * HDC_PART + 512] = mrun[threadIdx.x];
        part[threadIdx.x * HDC_PART + 513] = l_run;
    }
    trace_mark(tr, 48);
}

/* Phase 3 on tensor cores with the heads in four groups of 8
 * (P.hsplit == 4, chosen by the host when 4 x nsplit CTAs fit in the
 * grid: every context up to 33 splits of 128 tokens).  CTA b takes split
 * b / 4 and heads 8 (b % 4) .. 8 (b % 4) + 7, so that a context of 4096
 * (33 splits) keeps 132 CTAs busy instead of 33, and each CTA loads a
 * quarter of the query and stores a quarter of the partials.  The four
 * CTAs of a split read the same cache rows (the three after the first
 * from L2).  The same partials (layout and meaning) as mla_attend_tc,
 * so the merge does not change:
 *   scores: [64 tokens x 576] x [576 x 8 heads], warp w the 16 tokens
 *           16 (w % 4) over a quarter of the 36 k-steps (w / 4), the three
 *           parts in three accumulators; the four quarters added in
 *           order by the softmax;
 *   values: [512 dimensions x 64 tokens] x [64 tokens x 8 heads] (the
 *           cache block transposed by ldmatrix), warp w dimensions 32 w
 *           .. 32 w + 31 (two tiles), p in three parts.
 * The cache blocks are double-buffered: the copies of block i + 1 go out
 * before block i's arithmetic.  Smem map in bytes: two cache blocks,
 * query parts, score quarters, p parts, statistics. */
#define T8_KC 0                        /* two blocks, double-buffered */
#define T8_QP (T8_KC + 2 * TC_BLOCK)
#define T8_SC (T8_QP + 3 * 8 * TC_ROW)
#define T8_PP (T8_SC + 4 * TC_TB * 8 * 4)
#define T8_RED (T8_PP + 3 * 8 * TC_PROW)
#define T8_AL (T8_RED + 2 * HDC_WARPS * 8 * 4)
#define T8_END (T8_AL + 16 * 4)
static_assert(T8_END <= GEMV_BAR_OFF, "8-head attention smem map");
static_assert(HDC_WARPS == 16 && TC_TB == 64, "the 8-head attention's warp tiling");

__device__ __forceinline__ void ldsm_x2(uint32_t a, uint32_t (&r)[2])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
}

/* This CTA's split and head group under P.hsplit == 4; false when its
 * split is empty or past the last. */
__device__ __forceinline__ bool attend_split8(const StepParams &P, int &s, int &hb, int &t0,
                                              int &t1)
{
    s = blockIdx.x >> 2;
    hb = 8 * (blockIdx.x & 3);
    if (s >= P.nsplit)
        return false;
    t0 = s * P.split_len;
    t1 = min(P.pos + 1, t0 + P.split_len);
    return t0 < t1;
}

__device__ __noinline__ void mla_attend_tc8(const StepParams &P, const LayerDev &L, float *sm,
                                            unsigned long long *tr)
{
    int s, hb, t0, t1;
    if (!attend_split8(P, s, hb, t0, t1))
        return;
    const float score_scale = 0.07216878364870322f;
    const uint16_t *ckv = P.ckv[L.slot], *kr = P.krope[L.slot];
    char *sb = reinterpret_cast<char *>(sm);
    const uint32_t base = smem_addr(sm);
    float *sc = reinterpret_cast<float *>(sb + T8_SC);     /* [4][64][8] */
    float *redm = reinterpret_cast<float *>(sb + T8_RED), *redl = redm + HDC_WARPS * 8;
    float *al = reinterpret_cast<float *>(sb + T8_AL), *mrun = al + 8;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;

    /* the query's three parts of heads hb .. hb + 7, [part][head][576]:
     * two 16-byte pieces of ql a thread, one of q's rope part on threads
     * < 128, all in flight at once */
    {
        const float4 *ql4 = reinterpret_cast<const float4 *>(P.ql) + hb * 128;
        float4 v[3] = {};
        v[0] = __ldcg(ql4 + threadIdx.x);
        v[1] = __ldcg(ql4 + threadIdx.x + HDC_THREADS);
        if (threadIdx.x < 128)
            v[2] = __ldcg(reinterpret_cast<const float4 *>(P.q + (hb + (threadIdx.x >> 4)) * 192 +
                                                           128) +
                          (threadIdx.x & 15));
#pragma unroll
        for (int u = 0; u < 3; u++) {
            if (u == 2 && threadIdx.x >= 128)
                break;
            const int i = threadIdx.x + u * HDC_THREADS;
            const int hh = u < 2 ? i >> 7 : threadIdx.x >> 4;
            const int d = u < 2 ? (i & 127) * 4 : 512 + (threadIdx.x & 15) * 4;
            store_parts3(reinterpret_cast<uint16_t *>(sb + T8_QP + hh * TC_ROW) + d, v[u],
                         8 * TC_ROW / 2);
        }
    }
    trace_mark(tr, 40);
    if (threadIdx.x < 8)
        mrun[threadIdx.x] = -INFINITY;
    float l_run = 0.0f; /* threads < 8: head hb + tid */

    /* values: this warp's two tiles of 16 dimensions (32 w + 16 m ..) */
    float acc[2][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
        acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    /* scores: tokens 16 mt .., k-steps 9 kg .. 9 kg + 8 */
    const int mt = w & 3, kg = w >> 2;
    const uint32_t a_sc = base + T8_KC + (16 * mt + (lane & 15)) * TC_ROW + (lane >> 4) * 16;
    const uint32_t b_sc = base + T8_QP + (lane & 7) * TC_ROW + ((lane >> 3) & 1) * 16;
    /* values: A (dimensions x tokens) from the cache block by ldmatrix.trans:
     * matrix j of lane i holds tokens (j / 2) 8 .., dimensions (j % 2) 8 ..;
     * B (tokens x heads) from p [head][token]: matrix j tokens 16 (j / 2) +
     * 8 (j % 2) .. of the pair of 16-token steps */
    const int jm = lane >> 3, r8 = lane & 7;
    const uint32_t a_pv = base + T8_KC + (r8 + (jm >> 1) * 8) * TC_ROW + (32 * w + (jm & 1) * 8) * 2;
    const uint32_t b_pv = base + T8_PP + r8 * TC_PROW + ((jm >> 1) * 16 + (jm & 1) * 8) * 2;

    /* a. the first block into buffer 0, then the split's later rows into
     * L2 behind its copies (once for the four CTAs) */
    attend_copy_block(base + T8_KC, ckv, kr, t0, min(TC_TB, t1 - t0));
    asm volatile("cp.async.commit_group;" : : : "memory");
    trace_mark(tr, 41);
    if (threadIdx.x == 0 && hb == 0)
        attend_prefetch(ckv, kr, t0 + TC_TB, t1);
    for (int tb = t0, cur = 0; tb < t1; tb += TC_TB, cur ^= 1) {
        const int nt = min(TC_TB, t1 - tb);
        /* the next block's copies into the other buffer (whose readers,
         * the block before, passed the loop's last barrier) go out before
         * this block's arithmetic; then this block's are waited for */
        if (tb + TC_TB < t1) {
            attend_copy_block(base + T8_KC + (cur ^ 1) * TC_BLOCK, ckv, kr, tb + TC_TB,
                              min(TC_TB, t1 - tb - TC_TB));
            asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 1;" : : : "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" : : : "memory");
        }
        __syncthreads();
        if (tb == t0)
            trace_mark(tr, 25);
        const uint32_t kb = (uint32_t)cur * TC_BLOCK; /* this block's buffer */
        /* b. a quarter of the scores of 16 tokens x 8 heads */
        {
            float d[3][4];
#pragma unroll
            for (int p = 0; p < 3; p++)
                d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.0f;
#pragma unroll 3
            for (int ks = 9 * kg; ks < 9 * kg + 9; ks++) {
                uint32_t a[4];
                ldsm_x4(a_sc + kb + ks * 32, a);
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    uint32_t b[2];
                    ldsm_x2(b_sc + p * 8 * TC_ROW + ks * 32, b);
                    mma_bf16(d[p], a[0], a[1], a[2], a[3], b[0], b[1]);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = 16 * mt + g + (i >> 1) * 8, hh = 2 * tq + (i & 1);
                sc[(kg * TC_TB + t) * 8 + hh] = (d[0][i] + d[1][i]) + d[2][i];
            }
        }
        __syncthreads();
        if (tb == t0)
            trace_mark(tr, 42);
        /* c. online softmax statistics: thread i takes token i / 8 of head
         * i % 8 (warp w tokens 4 w .. 4 w + 3); p into its three bf16
         * parts [part][head][t] */
        {
            const int hh = lane & 7, t = threadIdx.x >> 3;
            float sv = -INFINITY;
            if (t < nt)
                sv = (((sc[t * 8 + hh] + sc[(TC_TB + t) * 8 + hh]) + sc[(2 * TC_TB + t) * 8 + hh]) +
                      sc[(3 * TC_TB + t) * 8 + hh]) *
                     score_scale;
            const float mb = softmax_max<8>(sv, redm, mrun);
            const float p = (mb == -INFINITY || sv == -INFINITY) ? 0.0f : expf(sv - mb);
            const float hi = bfr(p), mid = bfr(p - hi), lo = bfr((p - hi) - mid);
            uint16_t *pp = reinterpret_cast<uint16_t *>(sb + T8_PP + hh * TC_PROW) + t;
            pp[0] = f2bf(hi);
            pp[8 * TC_PROW / 2] = f2bf(mid);
            pp[16 * TC_PROW / 2] = f2bf(lo);
            softmax_commit<8>(p, mb, redl, al, mrun, l_run);
        }
        if (tb == t0)
            trace_mark(tr, 43);
        /* d. acc = acc * alpha + c^T p */
        {
            const float f0 = al[2 * tq], f1 = al[2 * tq + 1];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                acc[m][0] *= f0;
                acc[m][1] *= f1;
                acc[m][2] *= f0;
                acc[m][3] *= f1;
            }
#pragma unroll
            for (int k2 = 0; k2 < TC_TB / 32; k2++) {
                uint32_t b[3][4];
#pragma unroll
                for (int p = 0; p < 3; p++)
                    ldsm_x4(b_pv + p * 8 * TC_PROW + k2 * 64, b[p]);
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const int kt = 2 * k2 + kk;
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        uint32_t a[4];
                        ldsm_x4_t(a_pv + kb + kt * 16 * TC_ROW + m * 32, a);
#pragma unroll
                        for (int p = 0; p < 3; p++)
                            mma_bf16(acc[m], a[0], a[1], a[2], a[3], b[p][2 * kk],
                                     b[p][2 * kk + 1]);
                    }
                }
            }
        }
        __syncthreads();
    }
    trace_mark(tr, 26);
    float *part = P.parts + ((size_t)s * 32 + hb) * HDC_PART;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            part[(2 * tq + (i & 1)) * HDC_PART + 32 * w + 16 * m + g + (i >> 1) * 8] = acc[m][i];
    if (threadIdx.x < 8) {
        part[threadIdx.x * HDC_PART + 512] = mrun[threadIdx.x];
        part[threadIdx.x * HDC_PART + 513] = l_run;
    }
    trace_mark(tr, 48);
}

/* Phase 4: per head merge the splits into lat_h, then
 * o_h = bf(W_v,h^T lat_h) (kv_b's 128 W_v columns of the head, K = 512),
 * in 32 x P.merge_ctas tasks: a task merges its head's splits (each of
 * the head's tasks in the same order, so they hold the same latent) and
 * multiplies by 128 / merge_ctas of the columns (tiles of 32).
 * The merge reads ns x 512 partial values of L2: thread (g, d4) sums the
 * splits g, g + 4, ... of the four dimensions 4 d4 .. 4 d4 + 3 (16-byte
 * loads, 8 in flight), and the four groups are added in a fixed order;
 * the splits' weights exp(m_s - M) are computed once per split.  (Four
 * CTAs a head measured no faster in 2026-12-04's sixth session, 379.0
 * against 379.5 us at context 4096, when the statistics were read by
 * loops on every thread; now they save 1-4 us a step and are the
 * default, module.cu's HD_CUDA_MERGE_CTAS.  W_v primed into the ring at
 * the start, to stream while the splits are summed, measured 3 us slower:
 * the bulk copies delay the splits' loads; docs/PERF-CUDA.md.) */
__device__ __noinline__ void mla_merge(const StepParams &P, const LayerDev &L, float *sm)
{
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    const uint2 *xb = reinterpret_cast<const uint2 *>(sm + SM_XB);
    const int T = P.pos + 1;
    const int d4 = threadIdx.x & 127, sg = threadIdx.x >> 7;
    for (int task = blockIdx.x; task < 32 * P.merge_ctas; task += gridDim.x) {
        const int hh = task / P.merge_ctas;
        /* The splits' statistics, loaded in parallel, then their weights:
         * the maximum M and the sum of e_s l_s as block reductions (a
         * thread's splits, its warp, the 16 warps: a fixed order), not
         * loops over all the splits on every thread (ns rounds of shared
         * memory latency each). */
        float *st_m = sm + MERGE_STATS, *st_l = st_m + 1024;
        float *st_e = red, *grp = red + 1024, *bred = red + 3072; /* grp: 4 x 512 */
        int ns = 0;
        while (ns < P.nsplit && ns < 1024 && ns * P.split_len < T)
            ns++;
        for (int s = threadIdx.x; s < ns; s += HDC_THREADS) {
            st_m[s] = ldcg(P.parts + ((size_t)s * 32 + hh) * HDC_PART + 512);
            st_l[s] = ldcg(P.parts + ((size_t)s * 32 + hh) * HDC_PART + 513);
        }
        trace_mark(P.trace, 44);
        __syncthreads();
        float M = -INFINITY;
        for (int s = threadIdx.x; s < ns; s += HDC_THREADS)
            M = fmaxf(M, st_m[s]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        if ((threadIdx.x & 31) == 0)
            bred[threadIdx.x >> 5] = M;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < HDC_WARPS; i++)
            M = fmaxf(M, bred[i]);
        float dp = 0.0f;
        for (int s = threadIdx.x; s < ns; s += HDC_THREADS) {
            const float e = st_m[s] == -INFINITY ? 0.0f : expf(st_m[s] - M);
            st_e[s] = e;
            dp = fmaf(e, st_l[s], dp);
        }
        const float den = block_sum(dp, bred + 32); /* also orders st_e */
        trace_mark(P.trace, 45);
        float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float *pp = P.parts + (size_t)hh * HDC_PART + 4 * d4;
        for (int s0 = sg; s0 < ns; s0 += 32) {
            float4 a[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (s0 + 4 * u < ns)
                    a[u] = __ldcg(reinterpret_cast<const float4 *>(
                        pp + (size_t)(s0 + 4 * u) * 32 * HDC_PART));
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (s0 + 4 * u < ns) {
                    const float e = st_e[s0 + 4 * u];
                    num.x = fmaf(e, a[u].x, num.x);
                    num.y = fmaf(e, a[u].y, num.y);
                    num.z = fmaf(e, a[u].z, num.z);
                    num.w = fmaf(e, a[u].w, num.w);
                }
        }
        reinterpret_cast<float4 *>(grp)[sg * 128 + d4] = num;
        __syncthreads();
        {
            const int d = threadIdx.x;
            const float v = ((grp[d] + grp[512 + d]) + grp[1024 + d]) + grp[1536 + d];
            xs[(d >> 5) * HDC_XS_STRIDE + (d & 31)] = v / den;
        }
        xs_finish(xs, 512, 3); /* fp32 values */
        trace_mark(P.trace, 46);
        /* (the columns computed here, not kept through the merge: that
         * spilled registers; tiles past ncol / 32 repeat the first and are
         * not used) */
        const int per = P.merge_ctas, ncol = 128 / per, cq = (task - hh * per) * ncol;
        MatTile m[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            m[i] = mat_tile(L.p[2], 0, hh * 256 + 128 + cq + 32 * (i < ncol / 32 ? i : 0), xb, 3);
        gemv_run(m, ncol / 32, 2, 512, red, out);
        trace_mark(P.trace, 47);
        if (threadIdx.x < ncol)
            P.attn[hh * 128 + cq + threadIdx.x] = bfr(out[threadIdx.x]);
    }
}

#endif
