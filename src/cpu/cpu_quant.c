/* cpu_quant.c - activations laid out for the kernels (cpu.h): each group
 * of 4 values twice, once per 128-bit lane (one lane per column). */
#include "config.h"

#include "cpu.h"

void cpu_prepare_x(const float *x, int k, cpu_xq *q)
{
    for (int m = 0; m < k / 4; m++)
        for (int l = 0; l < 8; l++)
            q->xd[8 * m + l] = x[4 * m + (l & 3)];
    q->k = k;
}
