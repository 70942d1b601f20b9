/* racecheck-gemv.cu - the module's GEMV ring (src/cuda/gemv.cuh) on its
 * own, under compute-sanitizer's racecheck: one CTA runs gemv_run on
 * random int4 tiles in a few call patterns, so that a report can be
 * pinned to one of them.
 *   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -I src/cuda \
 *        -o rg scripts/racecheck-gemv.cu
 *   compute-sanitizer --tool racecheck ./rg MODE
 * Modes:
 *   0  one call, K = 2304, 8 blocks (the ring refills its slots)
 *   1  two calls, the same shape
 *   2  two calls, K = 2304 then K = 4096 (other slot sizes)
 *   3  two calls, K = 4096 then K = 1024
 *   4  one call of 4 blocks (no refill), then another of 4
 * It prints "done MODE" and the first output; the values are not checked
 * (tests/test_cuda checks the GEMV against the reference).  Modes 1, 3
 * and 4 drew a report each (bulk copy against bulk copy) while each call
 * initialized the ring's "full" barriers again; since they live through
 * the launch, no mode does (docs/PERF-CUDA.md, fourteenth session). */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "gemv.cuh"

__global__ void __launch_bounds__(HDC_THREADS, 1)
kern(const uint4 *w, const uint2 *sz, float *res, int mode)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    float *xs = sm + SM_XS, *red = sm + SM_RED, *out = sm + SM_OUT;
    gemv_reset();
    for (int i = threadIdx.x; i < 4096; i += HDC_THREADS)
        xs[(i >> 5) * HDC_XS_STRIDE + (i & 31)] = 1.0f / (float)(1 + (i & 7));
    xs_finish(xs, 4096, 1);
    const int K1 = mode == 3 ? 4096 : 2304;
    const int K2 = mode == 2 ? 4096 : mode == 3 ? 1024 : 2304;
    const int NB1 = mode == 4 ? 4 : 8;
    QMat q = {w, sz, K1, 16 * NB1, 0, 0};
    MatTile m[1] = {mat_tile(q, 0, 0, sm_xb(), 1)};
    gemv_run(m, 1, NB1, K1, red, out);
    if (threadIdx.x == 0)
        res[0] = out[0];
    if (mode > 0) {
        QMat q2 = {w, sz, K2, 16 * NB1, 0, 0};
        MatTile m2[1] = {mat_tile(q2, 0, 0, sm_xb(), 1)};
        gemv_run(m2, 1, NB1, K2, red, out);
        if (threadIdx.x == 0)
            res[1] = out[0];
    }
}

int main(int argc, char **argv)
{
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    /* enough for 8 blocks of K = 4096: weights and constants */
    const size_t wbytes = (size_t)8 * 64 * 512, zbytes = (size_t)8 * 32 * 128;
    std::vector<unsigned char> h(wbytes + zbytes);
    for (size_t i = 0; i < wbytes; i++)
        h[i] = (unsigned char)(i * 2654435761u >> 24);
    /* constants: scale 1/64 (bf16 0x3c80) twice, c1 = 136 (0x4308), c2 = 0 */
    for (size_t i = wbytes; i + 8 <= h.size(); i += 8) {
        const unsigned char c[8] = {0x80, 0x3c, 0x80, 0x3c, 0x08, 0x43, 0x00, 0x00};
        for (int j = 0; j < 8; j++)
            h[i + j] = c[j];
    }
    unsigned char *d;
    float *res, hr[2] = {0, 0};
    if (cudaMalloc(&d, h.size()) != cudaSuccess || cudaMalloc(&res, sizeof hr) != cudaSuccess)
        return 2;
    cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, HDC_SMEM_BYTES);
    int slots = HDC_SLOTS_DEFAULT;
    cudaMemcpyToSymbol(g_slots_cap, &slots, sizeof slots);
    kern<<<1, HDC_THREADS, HDC_SMEM_BYTES>>>(reinterpret_cast<const uint4 *>(d),
                                             reinterpret_cast<const uint2 *>(d + wbytes), res,
                                             mode);
    cudaError_t e = cudaMemcpy(hr, res, sizeof hr, cudaMemcpyDeviceToHost);
    printf("done %d: %s, %g %g\n", mode, cudaGetErrorString(e), hr[0], hr[1]);
    return e == cudaSuccess ? 0 : 1;
}
