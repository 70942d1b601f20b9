/* gemv.cuh - the int4 GEMV tile: TW columns of NM maps that share K.
 *
 * The CTA's 512 threads form 512/TW slots of TW threads; thread (slot, col)
 * streams 16-byte words (32 weights of one column) of chunks slot, slot +
 * SLOTS, ... with all its loads of a batch in flight before it uses them.
 * Dequantization stays in registers: the nibble becomes a float by a byte
 * permute into 2^23 + q and one subtraction, and the group's zero and scale
 * are applied once per 32 weights through the chunk sum of x:
 *   sum_k x_k (q_k - z) s = s (sum_k x_k q_k - z sum_k x_k).
 * (The per-weight bf16 rounding of SEMANTICS.md is skipped: within the
 * tolerances, see docs/PERF-CUDA.md.)  The slots' partial sums are reduced
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

__device__ __forceinline__ float chunk_dot(uint4 q, uint32_t sz, const float *x)
{
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = words[i] & 0x0F0F0F0Fu, hi = (words[i] >> 4) & 0x0F0F0F0Fu;
        float4 xa = x4[2 * i], xb = x4[2 * i + 1];
        d0 = fmaf(xa.x, nib(lo, 0), d0);
        d1 = fmaf(xb.x, nib(hi, 0), d1);
        d0 = fmaf(xa.y, nib(lo, 1), d0);
        d1 = fmaf(xb.y, nib(hi, 1), d1);
        d0 = fmaf(xa.z, nib(lo, 2), d0);
        d1 = fmaf(xb.z, nib(hi, 2), d1);
        d0 = fmaf(xa.w, nib(lo, 3), d0);
        d1 = fmaf(xb.w, nib(hi, 3), d1);
    }
    float scale = __uint_as_float(sz << 16), zero = __uint_as_float(sz & 0xffff0000u);
    return scale * ((d0 + d1) - zero * x[32]);
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
