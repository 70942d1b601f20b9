/* gemv.cuh - the int4 GEMV tile on tensor cores: TW columns (16 or 32) of NM
 * maps that share K.
 *
 * The weights come in units of 16 columns x 64 rows (repack.cu): one 16-byte
 * load a lane, four mma.m16n8k16 A fragments.  Each lane dequantizes its 32
 * weights two at a time in bf16x2, exactly as SEMANTICS.md rounds them
 * (deq), and the tensor cores multiply them by x.  x enters as the B operand
 * split into three bf16 parts, hi + mid + lo = x exactly (xb_build), in the
 * columns 0, 1, 2 of B, so the fp32 x is not rounded; the products are
 * exact and the sums fp32.
 *
 * Warp w takes the rows [w KU / 16, (w + 1) KU / 16) of every 16-column
 * block (KU = K / 64 units), issues all its loads before it computes, and
 * writes its partial sums; the warps' partials are summed in a fixed order,
 * so results do not change from run to run. */
#ifndef HD_CUDA_GEMV_CUH
#define HD_CUDA_GEMV_CUH

#include "common.cuh"

struct MatTile {
    const uint4 *w;  /* member base */
    const uint2 *sz;
    int N, n0;
    const uint2 *xb; /* x as B fragments (xs_finish), in shared memory */
    int xl;          /* lanes that hold parts of x: 4 (bf16 x) or 12 */
};

/* Two weights from the nibbles at bits 0-3 and 16-19 of v:
 * fma(bf((128 + q) - c1), s, c2) = bf((q - z) * s), rounded once. */
__device__ __forceinline__ uint32_t deq(uint32_t v, uint32_t c1, uint32_t s2,
                                        uint32_t c2)
{
    uint32_t b;
    asm("lop3.b32 %0, %1, 0x000F000F, 0x43004300, 0xEA;" : "=r"(b) : "r"(v));
    __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162 *>(&b);
    q = __hsub2(q, *reinterpret_cast<const __nv_bfloat162 *>(&c1));
    q = __hfma2(q, *reinterpret_cast<const __nv_bfloat162 *>(&s2),
                *reinterpret_cast<const __nv_bfloat162 *>(&c2));
    return *reinterpret_cast<uint32_t *>(&q);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The three dequantization constants of a (group, column) as bf16x2. */
struct Deq {
    uint32_t s2, c1, c2;
};

__device__ __forceinline__ Deq deq_consts(uint2 v)
{
    Deq d;
    d.s2 = v.x;
    d.c1 = __byte_perm(v.y, 0, 0x1010);
    d.c2 = __byte_perm(v.y, 0, 0x3232);
    return d;
}

/* One unit: four 16-row steps of a 16-column block, the even steps into
 * acc0 and the odd ones into acc1 (two independent mma chains); the B
 * fragments are read first. */
__device__ __forceinline__ void unit_mma(float (&acc0)[4], float (&acc1)[4], uint4 q,
                                         const Deq &za, const Deq &zb,
                                         const uint2 *xb, bool has_x)
{
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    uint2 bx[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        bx[i] = has_x ? xb[i * 12] : make_uint2(0u, 0u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t v = words[i];
        uint32_t a0 = deq(v, za.c1, za.s2, za.c2);
        uint32_t a1 = deq(v >> 4, zb.c1, zb.s2, zb.c2);
        uint32_t a2 = deq(v >> 8, za.c1, za.s2, za.c2);
        uint32_t a3 = deq(v >> 12, zb.c1, zb.s2, zb.c2);
        mma_bf16(i & 1 ? acc1 : acc0, a0, a1, a2, a3, bx[i].x, bx[i].y);
    }
}

/* The weights are read once per step: they go to L2 with evict_first (so
 * that they push out each other, not the code and the activations) and
 * skip L1. */
__device__ __forceinline__ unsigned long long evict_first_policy()
{
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

__device__ __forceinline__ uint4 ld_weights(const uint4 *p, unsigned long long pol)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}

/* A warp's units (at most GEMV_CMAX) of one 16-column block. */
#define GEMV_CMAX 4
struct Stage {
    uint4 q[GEMV_CMAX];
    uint2 za[GEMV_CMAX], zb[GEMV_CMAX];
};

__device__ __forceinline__ void stage_load(Stage &st, const MatTile &t, int nb, int KU,
                                           int kb0, int cnt, int lane,
                                           unsigned long long pol)
{
    const uint4 *base = t.w + ((size_t)nb * KU + kb0) * 32 + lane;
    const uint2 *sp = t.sz + (size_t)nb * (KU / 2) * 16 + (lane >> 2);
#pragma unroll
    for (int c = 0; c < GEMV_CMAX; c++) {
        if (c < cnt) {
            st.q[c] = ld_weights(base + c * 32, pol);
            const uint2 *p = sp + ((kb0 + c) >> 1) * 16;
            st.za[c] = __ldg(p);
            st.zb[c] = __ldg(p + 8);
        }
    }
}

/* out[j * 16 NB + c] = sum_k x_j[k] w_j[k][n0_j + c] for the nm maps of K
 * rows, NB blocks of 16 columns each.  red: HDC_WARPS * nm * NB * 16
 * floats; out: nm * NB * 16.  One compact loop (the megakernel runs its code
 * once a step: code size is time), with the next block's loads in flight
 * while the current one is multiplied.  Every thread of the CTA must call;
 * ends with __syncthreads. */
__device__ __noinline__ void gemv_run(const MatTile *m, int nm, int NB, int K,
                                      float *red, float *out)
{
    const int NJB = nm * NB, KU = K / 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int kb0 = w * KU / HDC_WARPS, cnt = (w + 1) * KU / HDC_WARPS - kb0;
    const unsigned long long pol = evict_first_policy();

    Stage cur, nxt;
    stage_load(cur, m[0], m[0].n0 >> 4, KU, kb0, cnt, lane, pol);
#pragma unroll 1
    for (int jb = 0; jb < NJB; jb++) {
        const int j = jb / NB;
        if (jb + 1 < NJB) {
            const MatTile &t = m[(jb + 1) / NB];
            stage_load(nxt, t, (t.n0 >> 4) + (jb + 1) % NB, KU, kb0, cnt, lane, pol);
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint2 *xb = m[j].xb + (size_t)kb0 * 4 * 12 + lane;
        const bool has_x = lane < m[j].xl;
#pragma unroll
        for (int c = 0; c < GEMV_CMAX; c++)
            if (c < cnt)
                unit_mma(acc, acc1, cur.q[c], deq_consts(cur.za[c]), deq_consts(cur.zb[c]),
                         xb + c * 4 * 12, has_x);
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[i] += acc1[i];
        /* column 0 + column 1 here, column 2 in the next lane */
        float lo0 = __shfl_down_sync(0xffffffffu, acc[0], 1);
        float lo2 = __shfl_down_sync(0xffffffffu, acc[2], 1);
        if (tq == 0) {
            red[(w * NJB + jb) * 16 + g] = (acc[0] + acc[1]) + lo0;
            red[(w * NJB + jb) * 16 + g + 8] = (acc[2] + acc[3]) + lo2;
        }
        cur = nxt;
    }
    __syncthreads();
    if (threadIdx.x < NJB * 16) {
        float s = 0.0f;
#pragma unroll 4
        for (int i = 0; i < HDC_WARPS; i++)
            s += red[i * NJB * 16 + threadIdx.x];
        out[threadIdx.x] = s;
    }
    __syncthreads();
}

template <int TW, int NM, int K>
__device__ __forceinline__ void gemv_tile(const MatTile (&m)[NM], float *red, float *out)
{
    static_assert(TW % 16 == 0 && K % 128 == 0 && K / 64 <= GEMV_CMAX * HDC_WARPS,
                  "tile shape");
    gemv_run(m, NM, TW / 16, K, red, out);
}

/* L2 prefetch of ncols columns from n0 (multiples of 16) of a member: one
 * run of weights and one of constants. */
__device__ __forceinline__ void prefetch_cols(const QMat &q, int member, int n0,
                                              int ncols)
{
    const size_t KU = (size_t)q.K / 64;
    l2_prefetch(q.w + member * q.wstride + (size_t)(n0 / 16) * KU * 32,
                (uint32_t)((size_t)(ncols / 16) * KU * 512));
    l2_prefetch(q.sz + member * q.szstride + (size_t)(n0 / 16) * (KU / 2) * 16,
                (uint32_t)((size_t)(ncols / 16) * (KU / 2) * 128));
}

__device__ __forceinline__ MatTile mat_tile(const QMat &q, int member, int n0,
                                            const uint2 *xb, int parts)
{
    MatTile t;
    t.w = q.w + (size_t)member * q.wstride;
    t.sz = q.sz + (size_t)member * q.szstride;
    t.N = q.N;
    t.n0 = n0;
    t.xb = xb;
    t.xl = 4 * parts;
    return t;
}

#endif
