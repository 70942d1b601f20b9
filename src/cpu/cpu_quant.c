/* cpu_quant.c - activations laid out for the kernels (cpu.h): per 8
 * inputs, the even ones (x0 x2 x4 x6) twice, then the odd ones twice (one
 * copy per 128-bit lane, one lane per column). */
#include "config.h"

#include "cpu.h"

void cpu_prepare_x(const float *x, int k, cpu_xq *q)
{
    for (int b = 0; b < k / 8; b++)
        for (int j = 0; j < 4; j++) {
            const float e = x[8 * b + 2 * j], o = x[8 * b + 2 * j + 1];
            q->xd[16 * b + j] = q->xd[16 * b + 4 + j] = e;
            q->xd[16 * b + 8 + j] = q->xd[16 * b + 12 + j] = o;
        }
    q->k = k;
}
