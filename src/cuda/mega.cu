/* mega.cu - the persistent cooperative megakernel: every layer of one decode
 * step in one launch, phases separated by grid barriers.
 *
 * Per KDA layer: proj | delta | o_proj | router | experts | down (6 phases);
 * per MLA layer: proj | absorb | attend | merge | o_proj | router | experts |
 * down (8).  RMSNorm and the top-8 are recomputed by every CTA instead of
 * being shared through a barrier. */
#include "mla.cuh"
#include "moe.cuh"

__global__ void __launch_bounds__(HDC_THREADS, 1) hd_mega(const __grid_constant__ StepParams P)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    int mark = 0;
    phase_mark(P.timers, mark);

    for (int l = 0; l < P.n_layers; l++) {
        const LayerDev &L = P.layers[l];
        const bool first = l == 0, last = l == P.n_layers - 1;
        if (L.kind == 'K') {
            kda_proj(P, L, first, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            kda_delta(P, L, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            out_proj(P, L.p[4], sm);
        } else {
            mla_proj(P, L, first, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            mla_absorb(P, L, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            mla_attend(P, L, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            mla_merge(P, L, sm);
            grid_sync(P.bar);
            phase_mark(P.timers, mark);
            out_proj(P, L.p[3], sm);
        }
        grid_sync(P.bar);
        phase_mark(P.timers, mark);
        moe_router(P, L, sm);
        grid_sync(P.bar);
        phase_mark(P.timers, mark);
        moe_experts(P, L, sm);
        grid_sync(P.bar);
        phase_mark(P.timers, mark);
        moe_down(P, L, last, sm);
        if (!last)
            grid_sync(P.bar);
        phase_mark(P.timers, mark);
    }
}

cudaError_t hdc_kernel_setup(int device, int *ctas_per_sm)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return e;
    e = cudaFuncSetAttribute(hd_mega, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             HDC_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, hd_mega,
                                                         HDC_THREADS, HDC_SMEM_BYTES);
}

cudaError_t hdc_launch(const StepParams *p, int grid, cudaStream_t stream)
{
    void *args[] = {const_cast<StepParams *>(p)};
    return cudaLaunchCooperativeKernel((const void *)hd_mega, dim3(grid),
                                       dim3(HDC_THREADS), args, HDC_SMEM_BYTES,
                                       stream);
}
