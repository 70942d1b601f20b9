/* cpu_quant.c - activations laid out for the kernels (cpu.h): per 8
 * inputs, the even ones (x0 x2 x4 x6) twice, then the odd ones twice (one
 * copy per 128-bit lane, one lane per column); and, where x is exactly
 * bf16, x as bf16 words for the vdpbf16ps kernel (cpu.h), or else, where
 * the scratch has room (cpu_xq.x3), as three exact bf16 parts for the
 * three-part vdpbf16ps kernel. */
#include "config.h"

#include <string.h>

#include "cpu.h"

/* x[i] is a bf16 value (low 16 bits zero) and not subnormal. */
static int bf16_exact(const float *x, int k)
{
    uint32_t bad = 0;
    for (int i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        /* low bits set, or exponent 0 with a nonzero mantissa */
        bad |= (u & 0xffffu) | ((u & 0x7f800000u) == 0 ? u & 0x007f0000u : 0);
    }
    return bad == 0;
}

/* f rounded to bf16 (to nearest even) and back, as bits; for finite f
 * (a NaN is not quieted: split3 refuses any x that is not finite). */
static inline uint32_t bf_bits(uint32_t u)
{
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

/* 1 when the bf16 word b is subnormal, infinite or NaN. */
static inline uint32_t bad_part(uint32_t b)
{
    const uint32_t e = b & 0x7f80u;
    return (e == 0x7f80u) | ((e == 0) & ((b & 0x7fu) != 0));
}

/* x as hi, mid, lo (cpu_xq) into xb [3k]; 1 when the split is exact and
 * every part is normal or zero.  The arithmetic is exact by construction
 * for a normal x (x - hi fits 16 bits, x - hi - mid 8), and checked: the
 * residual x - hi - mid - lo must be zero (a part that would be subnormal
 * rounds off bits), and x must be finite (hi of an x near FLT_MAX
 * rounds to infinity, which bad_part sees).  Blocks of 32 with a fixed
 * inner count, so that -O2 vectorizes the loop without an epilogue. */
static int split3(const float *x, int k, uint16_t *xb)
{
    uint32_t bad = 0;
    for (int b = 0; b < k; b += 32)
        for (int j = 0; j < 32; j++) {
            uint32_t u, uh, um, ul, u3;
            float h, m, l, r1, r2, r3;
            memcpy(&u, &x[b + j], 4);
            uh = bf_bits(u);
            memcpy(&h, &uh, 4);
            r1 = x[b + j] - h;
            memcpy(&um, &r1, 4);
            um = bf_bits(um);
            memcpy(&m, &um, 4);
            r2 = r1 - m;
            memcpy(&ul, &r2, 4);
            ul = bf_bits(ul);
            memcpy(&l, &ul, 4);
            r3 = r2 - l;
            memcpy(&u3, &r3, 4);
            xb[b + j] = (uint16_t)(uh >> 16);
            xb[k + b + j] = (uint16_t)(um >> 16);
            xb[2 * k + b + j] = (uint16_t)(ul >> 16);
            bad |= ((u & 0x7f800000u) == 0x7f800000u) | bad_part(uh >> 16) |
                   bad_part(um >> 16) | bad_part(ul >> 16) | ((u3 & 0x7fffffffu) != 0);
        }
    return bad == 0;
}

void cpu_prepare_x(const float *x, int k, cpu_xq *q)
{
    for (int b = 0; b < k / 8; b++)
        for (int j = 0; j < 4; j++) {
            const float e = x[8 * b + 2 * j], o = x[8 * b + 2 * j + 1];
            q->xd[16 * b + j] = q->xd[16 * b + 4 + j] = e;
            q->xd[16 * b + 8 + j] = q->xd[16 * b + 12 + j] = o;
        }
    q->k = k;
    q->bf16 = q->xb && k % 32 == 0 && bf16_exact(x, k);
    q->bf16x3 = 0;
    if (!q->bf16) {
        q->bf16x3 = q->xb && q->x3 && k % 32 == 0 && split3(x, k, q->xb);
        return;
    }
    for (int i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        q->xb[i] = (uint16_t)(u >> 16);
    }
}
