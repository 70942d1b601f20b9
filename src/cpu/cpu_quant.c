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

/* Where the input pair q (inputs 2q, 2q + 1; 0 <= q < 64) of a group lies
 * in cpu_xq.xt with P parts (cpu.h), in 32-bit words from the group's
 * start: row 8 (q / 32) + q % 8 of the group's 16, tile (q % 32) / 8 in
 * it, its part 0 (part i's words are i further). */
static size_t xt_pair(int q, int parts)
{
    return ((size_t)(8 * (q / 32) + q % 8) * 4 + (size_t)((q % 32) / 8)) * (size_t)parts;
}

/* x (k a multiple of 128) as hi + mid + lo, each bf16, in cpu_xq.xt's
 * order; 1 when every x is finite, every part zero or normal and the
 * parts x exactly.  Both subtractions are exact (each result is within
 * half a bf16 place of a number it is subtracted from, or subnormal), so
 * x = hi + mid + r2 and the parts are x when lo is r2.  Rounding x to bf16
 * leaves at most 16 significant bits and the second rounding at most 8,
 * which lo holds, unless r2 underflowed (x = 2^-120 + 2^-140: mid rounds
 * to zero): then lo != r2.  Branch-free, a group at a time: the parts
 * first (a loop the compiler vectorizes), then placed in pairs; an x that
 * fails only clears the flag. */
static int split3(const float *x, int k, uint16_t *xt)
{
    uint32_t bad = 0;
    for (int g = 0; g < k / CPU_GROUP; g++, x += CPU_GROUP) {
        uint16_t part[3][CPU_GROUP];
        for (int i = 0; i < CPU_GROUP; i++) {
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
            bad |= bf16_odd(hi) | bf16_odd(mid) | bf16_odd(lo) | (r2 != bf16_val(lo));
            part[0][i] = hi;
            part[1][i] = mid;
            part[2][i] = lo;
        }
        for (int q = 0; q < CPU_GROUP / 2; q++) {
            uint16_t *dst = xt + 2 * ((size_t)g * 64 * 3 + xt_pair(q, 3));
            for (int n = 0; n < 3; n++)
                memcpy(dst + 2 * n, &part[n][2 * q], 4);
        }
    }
    return bad == 0;
}

void cpu_prepare_x(const float *x, int k, cpu_xq *q)
{
    q->k = k;
    q->bf16 = q->xb && k % 32 == 0 && bf16_exact(x, k);
    q->f32 = q->x1 = q->x3 = 0;
    if (q->bf16) {
        for (int i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            q->xb[i] = (uint16_t)(u >> 16);
        }
        if (q->xt && k % 128 == 0) {
            for (int g = 0; g < k / CPU_GROUP; g++)
                for (int p = 0; p < CPU_GROUP / 2; p++) {
                    uint32_t w;
                    memcpy(&w, q->xb + g * CPU_GROUP + 2 * p, 4);
                    memcpy(q->xt + 2 * ((size_t)g * 64 + xt_pair(p, 1)), &w, 4);
                }
            q->x1 = 1;
        }
        return;
    }
    if (q->xe && k % 16 == 0) {
        for (int b = 0; b < k; b += 16)
            for (int j = 0; j < 8; j++) {
                q->xe[b + j] = x[b + 2 * j];
                q->xe[b + 8 + j] = x[b + 2 * j + 1];
            }
        q->f32 = 1;
        if (q->xt && k % 128 == 0)
            q->x3 = split3(x, k, q->xt);
        return;
    }
    /* the xd floats only for what takes neither of the above (cpu_gemv_pairs) */
    for (int b = 0; b < k / 8; b++)
        for (int j = 0; j < 4; j++) {
            const float e = x[8 * b + 2 * j], o = x[8 * b + 2 * j + 1];
            q->xd[16 * b + j] = q->xd[16 * b + 4 + j] = e;
            q->xd[16 * b + 8 + j] = q->xd[16 * b + 12 + j] = o;
        }
}
