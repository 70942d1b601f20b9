/* cpu_quant.c - activations laid out for the kernels (cpu.h): per 8
 * inputs, the even ones (x0 x2 x4 x6) twice, then the odd ones twice (one
 * copy per 128-bit lane, one lane per column); and, where x is exactly
 * bf16, x as bf16 words for the vdpbf16ps kernel (cpu.h), or else, where
 * the scratch has room (cpu_xq.xe), as floats per 16 inputs, the even ones
 * then the odd ones, for the fp32 kernel of the same instruction set. */
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
    q->f32 = 0;
    if (!q->bf16) {
        if (q->xe && k % 16 == 0) {
            for (int b = 0; b < k; b += 16)
                for (int j = 0; j < 8; j++) {
                    q->xe[b + j] = x[b + 2 * j];
                    q->xe[b + 8 + j] = x[b + 2 * j + 1];
                }
            q->f32 = 1;
        }
        return;
    }
    for (int i = 0; i < k; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        q->xb[i] = (uint16_t)(u >> 16);
    }
}
