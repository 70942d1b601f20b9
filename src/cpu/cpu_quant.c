/* cpu_quant.c - activations laid out for the kernels (cpu.h): per 8
 * inputs, the even ones (x0 x2 x4 x6) twice, then the odd ones twice (one
 * copy per 128-bit lane, one lane per column); and, where x is exactly
 * bf16, x as bf16 words for the vdpbf16ps kernel (cpu.h), or else, where
 * the scratch has room (cpu_xq.xe), as floats per 16 inputs, the even ones
 * then the odd ones, for the fp32 kernel of the same instruction set; and
 * then, where the scratch has room for them (cpu_xq.xt), as three bf16
 * parts for the AMX kernel. */
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

/* f rounded to bf16, to nearest even (f finite). */
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

/* 1 when h is zero or normal (not subnormal, not Inf or NaN). */
static int bf16_plain(uint16_t h)
{
    const unsigned e = (h >> 7) & 0xffu;
    return (h & 0x7fffu) == 0 || (e != 0 && e != 0xffu);
}

/* x as hi + mid + lo, each bf16 (cpu_xq.xt's order), and 1 when that is x
 * exactly with every part zero or normal.  Rounding x to bf16 leaves a
 * remainder of at most 16 significant bits, the second rounding one of at
 * most 8, which the third part holds; both subtractions are exact.  The
 * sum is checked anyway, in double (exact for three such parts), so that
 * an x this misses (one that over- or underflows) stays on the fp32 FMAs. */
static int split3(const float *x, int k, uint16_t *xt)
{
    int ok = 1;
    for (int i = 0; i < k; i++) {
        const float v = x[i];
        uint16_t hi, mid, lo;
        float r1, r2;
        if (!(v - v == 0.0f)) {          /* Inf or NaN */
            ok = 0;
            hi = mid = lo = 0;
        } else {
            hi = bf16_rne(v);
            r1 = v - bf16_val(hi);
            mid = bf16_rne(r1);
            r2 = r1 - bf16_val(mid);
            lo = bf16_rne(r2);
            ok &= bf16_plain(hi) & bf16_plain(mid) & bf16_plain(lo);
            ok &= (double)bf16_val(hi) + (double)bf16_val(mid) + (double)bf16_val(lo) ==
                  (double)v;
        }
        /* block of 32 inputs, pair r, then the part and the input's parity */
        uint16_t *row = xt + (size_t)(i / 32) * 96 + (size_t)(i % 32 / 2) * 6 + (i & 1);
        row[0] = hi;
        row[2] = mid;
        row[4] = lo;
    }
    return ok;
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
    q->f32 = q->x3 = 0;
    if (!q->bf16) {
        if (q->xe && k % 16 == 0) {
            for (int b = 0; b < k; b += 16)
                for (int j = 0; j < 8; j++) {
                    q->xe[b + j] = x[b + 2 * j];
                    q->xe[b + 8 + j] = x[b + 2 * j + 1];
                }
            q->f32 = 1;
            if (q->xt && k % 32 == 0)
                q->x3 = split3(x, k, q->xt);
        }
        return;
    }
    for (int i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        q->xb[i] = (uint16_t)(u >> 16);
    }
}
