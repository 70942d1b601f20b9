/* gemv-bench.cu - the module's GEMV (src/cuda/gemv.cuh) timed on its own:
 * every SM runs one CTA that calls gemv_run CALLS times, each call on NB
 * 16-column blocks of K rows that no other call reads (so the weights
 * come from DRAM), with x as bf16 (parts 1) or fp32 (parts 3).  What it
 * prints: the time of a call (launch overhead spread over the calls) and
 * the weight bytes per second of the whole GPU.  Build variants of the
 * unit loop with -DGEMV_UNROLL=N, and force the warps a
 * block with the SPLIT argument (0: the module's choice).
 *   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -I src/cuda \
 *        -o gb scripts/gemv-bench.cu
 *   ./gb K NB PARTS SPLIT [CALLS]
 * The sums are not checked (tests/test_cuda checks the GEMV against the
 * reference); "out" is printed so that the work is not optimized away. */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "gemv.cuh"

__global__ void __launch_bounds__(HDC_THREADS, 1)
kern(const uint4 *w, const uint2 *sz, float *res, int K, int NB, int parts, int calls,
     size_t wstep, size_t zstep)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    gemv_reset();
    for (int i = threadIdx.x; i < K; i += HDC_THREADS)
        xs[(i >> 5) * HDC_XS_STRIDE + (i & 31)] = 1.0f / (float)(3 + (i & 7));
    xs_finish(xs, K, parts);
    float acc = 0.0f;
    for (int c = 0; c < calls; c++) {
        const size_t cta = (size_t)c * gridDim.x + blockIdx.x;
        QMat q = {w + cta * wstep, sz + cta * zstep, K, 16 * NB, 0, 0};
        MatTile m[1] = {mat_tile(q, 0, 0, sm_xb(), parts)};
        gemv_run(m, 1, NB, K, red, out);
        acc += out[threadIdx.x % (16 * NB)];
    }
    if (threadIdx.x == 0)
        res[blockIdx.x] = acc;
}

int main(int argc, char **argv)
{
    const int K = argc > 1 ? atoi(argv[1]) : 2304;
    const int NB = argc > 2 ? atoi(argv[2]) : 8;
    const int parts = argc > 3 ? atoi(argv[3]) : 1;
    int split = argc > 4 ? atoi(argv[4]) : 0;
    int calls = argc > 5 ? atoi(argv[5]) : 0;
    if (K % 128 || K > 4096 || NB < 1 || NB > 16 || (parts != 1 && parts != 3))
        return 2;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const size_t KU = K / 64;
    const size_t wcall = (size_t)NB * KU * 512, zcall = (size_t)NB * (KU / 2) * 128;
    /* about 2 GB of weights in all unless CALLS says */
    if (calls <= 0)
        calls = (int)((2ull << 30) / ((wcall + zcall) * sms));
    const size_t wall = wcall * sms * calls, zall = zcall * sms * calls;
    unsigned char *d;
    float *res;
    if (cudaMalloc(&d, wall + zall) != cudaSuccess || cudaMalloc(&res, sms * sizeof(float)))
        return 3;
    cudaMemset(d, 0x5a, wall);
    /* constants: scale 1/64 (bf16 0x3c80) twice, c1 = 136 (0x4308), c2 = 0 */
    {
        unsigned char *h = (unsigned char *)malloc(zall);
        if (!h)
            return 3;
        for (size_t i = 0; i + 8 <= zall; i += 8) {
            const unsigned char c[8] = {0x80, 0x3c, 0x80, 0x3c, 0x08, 0x43, 0x00, 0x00};
            for (int j = 0; j < 8; j++)
                h[i + j] = c[j];
        }
        cudaMemcpy(d + wall, h, zall, cudaMemcpyHostToDevice);
        free(h);
    }
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, HDC_SMEM_BYTES);
    int slots = HDC_SLOTS_DEFAULT;
    cudaMemcpyToSymbol(g_slots_cap, &slots, sizeof slots);
    cudaMemcpyToSymbol(g_split_force, &split, sizeof split);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(e0);
        kern<<<sms, HDC_THREADS, HDC_SMEM_BYTES>>>(reinterpret_cast<const uint4 *>(d),
                                                  reinterpret_cast<const uint2 *>(d + wall), res,
                                                  K, NB, parts, calls, wcall / 16, zcall / 8);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best)
            best = ms;
    }
    float out = 0;
    cudaError_t e = cudaMemcpy(&out, res, sizeof out, cudaMemcpyDeviceToHost);
    printf("gemv K=%d NB=%d parts=%d split=%d unroll=%d calls=%d: %.2f us a call, "
           "%.0f GB/s of weights (%s, out %g)\n",
           K, NB, parts, split, GEMV_UNROLL, calls, best * 1e3 / calls,
           (double)(wall + zall) / (best * 1e-3) / 1e9, cudaGetErrorString(e), out);
    return e == cudaSuccess ? 0 : 1;
}
