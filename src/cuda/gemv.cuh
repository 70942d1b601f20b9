/* gemv.cuh - the int4 GEMV tile: TW columns of NM maps that share K.
 *
 * The CTA's 512 threads form 512/TW slots of TW threads; thread (slot, col)
 * streams 16-byte words (32 weights of one column) of chunks slot, slot +
 * SLOTS, ... with all its loads of a batch in flight before it uses them.
 * Dequantization stays in registers, two weights at a time in bf16x2
 * arithmetic with SEMANTICS.md's rounding (wpair), accumulation in fp32.
 * (A first version skipped the per-weight rounding through chunk sums of x;
 * its router flipped experts too often: docs/PERF-CUDA.md.)  The slots'
 * partial sums are reduced
 * in a fixed order, so results do not change from run to run. */
#ifndef HD_CUDA_GEMV_CUH
#define HD_CUDA_GEMV_CUH

#include "common.cuh"

struct MatTile {
    const uint4 *w;      /* member base */
    const uint32_t *sz;
    int N, n0;
    const float *xs;     /* padded x in shared memory */
};

__device__ __forceinline__ float nib(uint32_t v, int b)
{
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | (unsigned)b)) -
           8388608.0f;
}

/* Two weights bf((q - z) * s) from the nibbles at bits 0-3 and 16-19 of v,
 * exactly as SEMANTICS.md rounds them: 0x4300 | q is the bf16 128 + q, and
 * bf16x2 arithmetic rounds once (q - z is exact for bf16 zeros of the
 * motif's form, (q - z) * s is rounded to nearest even). */
__device__ __forceinline__ float2 wpair(uint32_t v, __nv_bfloat162 z2,
                                        __nv_bfloat162 s2)
{
    uint32_t b = (v & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162 *>(&b);
    q = __hsub2(q, __floats2bfloat162_rn(128.0f, 128.0f));
    q = __hmul2(__hsub2(q, z2), s2);
    uint32_t r = *reinterpret_cast<uint32_t *>(&q);
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}

__device__ __forceinline__ float chunk_dot(uint4 q, uint32_t sz, const float *x)
{
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    uint32_t words[4] = {q.x, q.y, q.z, q.w};
    uint32_t sb = sz & 0xffffu, zb = sz >> 16;
    uint32_t s2b = sb | (sb << 16), z2b = zb | (zb << 16);
    __nv_bfloat162 s2 = *reinterpret_cast<__nv_bfloat162 *>(&s2b);
    __nv_bfloat162 z2 = *reinterpret_cast<__nv_bfloat162 *>(&z2b);
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t w = words[i];
        float4 xa = x4[2 * i], xb = x4[2 * i + 1];
        float2 p0 = wpair(w, z2, s2);       /* k = 8i + 0, 8i + 2 */
        float2 p1 = wpair(w >> 4, z2, s2);  /* k = 8i + 4, 8i + 6 */
        float2 p2 = wpair(w >> 8, z2, s2);  /* k = 8i + 1, 8i + 3 */
        float2 p3 = wpair(w >> 12, z2, s2); /* k = 8i + 5, 8i + 7 */
        d0 = fmaf(xa.x, p0.x, d0);
        d1 = fmaf(xa.z, p0.y, d1);
        d0 = fmaf(xb.x, p1.x, d0);
        d1 = fmaf(xb.z, p1.y, d1);
        d0 = fmaf(xa.y, p2.x, d0);
        d1 = fmaf(xa.w, p2.y, d1);
        d0 = fmaf(xb.y, p3.x, d0);
        d1 = fmaf(xb.w, p3.y, d1);
    }
    return d0 + d1;
}

/* out[j * TW + c] = sum_k x_j[k] w_j[k][n0_j + c] for the NM maps, all with
 * KC chunks of 32 rows.  red: (512/TW) * NM * TW floats; out: NM * TW.
 * Every thread of the CTA must call; ends with __syncthreads. */
template <int TW, int NM>
__device__ void gemv_tile(const MatTile (&m)[NM], int KC, float *red, float *out)
{
    constexpr int SLOTS = HDC_THREADS / TW;
    constexpr int UNR = NM >= 8 ? 1 : NM >= 4 ? 2 : (NM == 1 ? 5 : 9 / NM);
    const int col = threadIdx.x % TW, slot = threadIdx.x / TW;
    float acc[NM];
#pragma unroll
    for (int j = 0; j < NM; j++)
        acc[j] = 0.0f;
    for (int c0 = slot; c0 < KC; c0 += SLOTS * UNR) {
        uint4 q[NM][UNR];
        uint32_t s[NM][UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int c = c0 + u * SLOTS;
            if (c < KC) {
#pragma unroll
                for (int j = 0; j < NM; j++) {
                    q[j][u] = ld_stream(m[j].w + (size_t)c * m[j].N + m[j].n0 + col);
                    s[j][u] = __ldg(m[j].sz + (size_t)(c >> 2) * m[j].N + m[j].n0 + col);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int c = c0 + u * SLOTS;
            if (c < KC) {
#pragma unroll
                for (int j = 0; j < NM; j++)
                    acc[j] += chunk_dot(q[j][u], s[j][u], m[j].xs + c * HDC_XS_STRIDE);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NM; j++)
        red[(slot * NM + j) * TW + col] = acc[j];
    __syncthreads();
    if (threadIdx.x < NM * TW) {
        int j = threadIdx.x / TW, c = threadIdx.x % TW;
        float t = 0.0f;
#pragma unroll 8
        for (int s2 = 0; s2 < SLOTS; s2++)
            t += red[(s2 * NM + j) * TW + c];
        out[threadIdx.x] = t;
    }
    __syncthreads();
}

__device__ __forceinline__ MatTile mat_tile(const QMat &q, int member, int n0,
                                            const float *xs)
{
    MatTile t;
    t.w = q.w + (size_t)member * q.wstride;
    t.sz = q.sz + (size_t)member * q.szstride;
    t.N = q.N;
    t.n0 = n0;
    t.xs = xs;
    return t;
}

#endif
