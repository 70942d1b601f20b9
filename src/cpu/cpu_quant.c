/* cpu_quant.c - activations laid out for the kernels (cpu.h): per 8
 * inputs, the even ones (x0 x2 x4 x6) twice, then the odd ones twice (one
 * copy per 128-bit lane, one lane per column); and, where x is exactly
 * bf16, x as bf16 words for the vdpbf16ps kernel (cpu.h), or else, where
 * the scratch has room (cpu_xq.xe), as floats per 16 inputs, the even ones
 * then the odd ones, for the fp32 kernel of the same instruction set; and
 * then, where the scratch has room for them (cpu_xq.xt), as its bf16 words
 * or as three bf16 parts in the order of the AMX kernels' tiles. */
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

/* f rounded to bf16, to nearest even (f finite; anything for the rest). */
static uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_val(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 1 when h is a subnormal, an infinity or a NaN (not zero, not normal). */
static uint32_t bf16_odd(uint16_t h)
{
    const uint32_t e = (h >> 7) & 0xffu;
    return (e == 0xffu) | ((e == 0) & ((h & 0x7fu) != 0));
}

/* Where input i of x (k a multiple of 128) goes in cpu_xq.xt with P parts
 * (cpu.h): group i / 128, tile n, position p: row p / 2 of the group's 16,
 * tile n's 2 P words in it; part 0's word (part q's is q * 2 further). */
static size_t xt_index(int i, int parts)
{
    const int g = i / 128, j = i % 128;
    const int n = (j % 64) / 16, p = 16 * (j / 64) + j % 16;
    return ((size_t)(16 * g + p / 2) * 4 + (size_t)n) * (size_t)(2 * parts) + (size_t)(p & 1);
}

/* x (k a multiple of 128) as hi + mid + lo, each bf16, in cpu_xq.xt's
 * order; 1 when every x is finite, every part zero or normal and the
 * parts x exactly.  Both subtractions are exact (each result is within
 * half a bf16 place of a number it is subtracted from, or subnormal), so
 * x = hi + mid + r2 and the parts are x when lo is r2.  Rounding x to bf16
 * leaves at most 16 significant bits and the second rounding at most 8,
 * which lo holds, unless r2 underflowed (x = 2^-120 + 2^-140: mid rounds
 * to zero): then lo != r2.  Branch-free: an x that fails only clears the
 * flag. */
static int split3(const float *x, int k, uint16_t *xt)
{
    uint32_t bad = 0;
    for (int i = 0; i < k; i++) {
        const float v = x[i];
        uint32_t u;
        memcpy(&u, &v, 4);
        /* (tested on x itself: a NaN's rounding can wrap to zero) */
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        const uint16_t hi = bf16_rne(v);
        const float r1 = v - bf16_val(hi);
        const uint16_t mid = bf16_rne(r1);
        const float r2 = r1 - bf16_val(mid);
        const uint16_t lo = bf16_rne(r2);
        uint16_t *row = xt + xt_index(i, 3);
        bad |= bf16_odd(hi) | bf16_odd(mid) | bf16_odd(lo) | (r2 != bf16_val(lo));
        row[0] = hi;
        row[2] = mid;
        row[4] = lo;
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
    q->f32 = q->x1 = q->x3 = 0;
    if (!q->bf16) {
        if (q->xe && k % 16 == 0) {
            for (int b = 0; b < k; b += 16)
                for (int j = 0; j < 8; j++) {
                    q->xe[b + j] = x[b + 2 * j];
                    q->xe[b + 8 + j] = x[b + 2 * j + 1];
                }
            q->f32 = 1;
            if (q->xt && k % 128 == 0)
                q->x3 = split3(x, k, q->xt);
        }
        return;
    }
    for (int i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        q->xb[i] = (uint16_t)(u >> 16);
    }
    if (q->xt && k % 128 == 0) {
        for (int i = 0; i < k; i++)
            q->xt[xt_index(i, 1)] = q->xb[i];
        q->x1 = 1;
    }
}
