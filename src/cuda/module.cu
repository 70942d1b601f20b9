/* module.cu - the CUDA backend's hd_backend_ops and the module's entry
 * point: probing, weight upload, device state, the step, bandwidth. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#include "hd_cuda.h"
#include "cuda_module.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

/* One launch at a time in the process: a cooperative grid takes every SM,
 * and the per-model scratch is shared by the model's states. */
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

struct CudaModel {
    int device, grid;
    void *weights;           /* one allocation: every repacked tensor */
    LayerDev *layers;        /* device copy */
    cudaStream_t stream;
    /* scratch */
    void *scratch;
    StepParams base;         /* scratch pointers filled in */
    size_t parts_splits;
    /* Page-locked staging of a step's input and output (HD_HIDDEN bf16
     * each), mapped into the device: a copy from pageable memory goes
     * through the driver's own staging buffer and blocks the host */
    uint16_t *pinned;
    /* How a step's vectors travel (HD_CUDA_IO): direct, the input in the
     * launch's parameters and the output written by the kernel straight
     * into pinned (mapped); or copy, one copy each way through device
     * scratch (the first version) */
    bool io_direct;
    uint16_t *hout_dev; /* the device's address of pinned + HD_HIDDEN */
    int split_min;      /* the fewest tokens an attention split takes */
};

struct CudaState {
    float *S[HD_MAX_LAYERS];
    uint16_t *conv[HD_MAX_LAYERS];
    uint16_t *ckv[HD_MAX_LAYERS];
    uint16_t *krope[HD_MAX_LAYERS];
    void *ptrs; /* device arrays: S, conv, ckv, krope (HD_MAX_LAYERS each) */
};

static hd_status fail(char *err, size_t n, hd_status st, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return st;
}

static hd_status cuda_probe(char *err, size_t n)
{
    int count = 0, drv = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0)
        return fail(err, n, HD_ERR_BACKEND_UNAVAILABLE,
                    "no CUDA driver: %s", e != cudaSuccess ? cudaGetErrorString(e)
                                                           : "driver not installed");
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return fail(err, n, HD_ERR_BACKEND_UNAVAILABLE,
                    "cudaGetDeviceCount failed: %s", cudaGetErrorString(e));
    if (count < 1)
        return fail(err, n, HD_ERR_BACKEND_UNAVAILABLE, "no CUDA device");
    for (int d = 0; d < count; d++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) ==
                cudaSuccess && major >= 9)
            return HD_OK;
    }
    return fail(err, n, HD_ERR_BACKEND_UNAVAILABLE,
                "no CUDA device of compute capability 9.0 or newer (the module "
                "is built for sm_90a with a compute_90 PTX fallback)");
}

#define CK(call)                                                              \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) {                                              \
            st = fail(err, err_size, HD_ERR_BACKEND, "%s: %s", #call,         \
                      cudaGetErrorString(e_));                                \
            goto out;                                                         \
        }                                                                     \
    } while (0)

static void model_release(CudaModel *cm)
{
    if (!cm)
        return;
    cudaSetDevice(cm->device);
    cudaFree(cm->weights);
    cudaFree(cm->layers);
    cudaFree(cm->scratch);
    cudaFreeHost(cm->pinned);
    if (cm->stream)
        cudaStreamDestroy(cm->stream);
    delete cm;
}

/* Bytes of bf16 tensors uploaded as they are. */
static size_t pad256(size_t b) { return (b + 255) / 256 * 256; }

/* An integer switch from the environment: its value when set to a number
 * in [lo, hi], else def. */
static int env_int(const char *name, int lo, int hi, int def)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return def;
    long n = strtol(v, &end, 0);
    return *end == '\0' && n >= lo && n <= hi ? (int)n : def;
}

static hd_status cuda_model_init(hd_model *model, char *err, size_t err_size)
{
    hd_status st = HD_OK;
    CudaModel *cm = new CudaModel();
    std::vector<uint8_t> host;
    size_t total = 0, off = 0;
    std::vector<LayerDev> ld(model->n_layers);
    cudaDeviceProp prop;
    int per_sm = 0, coop = 0;
    const int E = model->experts;
    size_t nf;
    float *f;

    memset(cm, 0, sizeof *cm);
    cm->device = model->device;
    CK(cudaSetDevice(cm->device));
    CK(cudaGetDeviceProperties(&prop, cm->device));
    if (prop.major < 9) {
        st = fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE,
                  "device %d (%s) has compute capability %d.%d; the CUDA backend "
                  "needs 9.0 or newer", cm->device, prop.name, prop.major, prop.minor);
        goto out;
    }
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, cm->device));
    {
        int split = env_int("HD_CUDA_SPLIT", 1, 16, 0);
        if (split & (split - 1)) /* 1, 2, 4, 8 or 16 */
            split = 0;
        /* HD_CUDA_SLOTS=N (1 .. 16): at most N ring slots a GEMV, fewer
         * bulk copies in flight an SM; 5 unless set (16: as many as fit,
         * up to 7 for K = 2304, 4 for K = 4096, 16 for K = 1024).  A cap
         * of 4 or 5 measured 1-1.5 % faster at context 4096 than none, 2
         * slots 5 % slower (docs/PERF-CUDA.md, v8 and v9). */
        const int slots = env_int("HD_CUDA_SLOTS", 1, 16, HDC_SLOTS_DEFAULT);
        CK(hdc_kernel_setup(cm->device, &per_sm, split, slots));
    }
    if (!coop || per_sm < 1) {
        st = fail(err, err_size, HD_ERR_BACKEND,
                  "device %d (%s): the megakernel cannot be co-resident "
                  "(cooperative launch %s, %d CTAs of %d threads per SM)",
                  cm->device, prop.name, coop ? "supported" : "unsupported",
                  per_sm, HDC_THREADS);
        goto out;
    }
    cm->grid = prop.multiProcessorCount; /* one CTA per SM, all co-resident */

    /* Sizes of everything uploaded. */
    for (int i = 0; i < model->n_layers; i++) {
        const hd_layer *L = &model->layers[i];
        const hd_qlinear *q[5];
        int nq = 0;
        total += 2 * pad256(HD_HIDDEN * 2);
        if (L->kind == 'K') {
            const hd_kda_weights *w = &L->kda;
            q[0] = &w->q_proj; q[1] = &w->k_proj; q[2] = &w->v_proj;
            q[3] = &w->g_proj; q[4] = &w->o_proj; nq = 5;
            total += pad256(32 * HD_HIDDEN * 2) + pad256(3 * 4096 * 4 * 2);
        } else {
            const hd_mla_weights *w = &L->mla;
            q[0] = &w->q_proj; q[1] = &w->kv_a; q[2] = &w->kv_b; q[3] = &w->o_proj;
            nq = 4;
        }
        for (int j = 0; j < nq; j++)
            total += hdc_repack_bytes(q[j]->k, q[j]->n, q[j]->count);
        total += pad256((size_t)E * HD_HIDDEN * 2);
        const hd_qlinear *mq[6] = {&L->moe.gate, &L->moe.up, &L->moe.down,
                                   &L->moe.s_gate, &L->moe.s_up, &L->moe.s_down};
        for (int j = 0; j < 6; j++)
            total += hdc_repack_bytes(mq[j]->k, mq[j]->n, mq[j]->count);
    }
    host.resize(total);
    CK(cudaMalloc(&cm->weights, total));
    {
        uint8_t *hb = host.data();
        const uint8_t *db = (const uint8_t *)cm->weights;
        auto raw = [&](const void *src, size_t bytes) -> const uint16_t * {
            memcpy(hb + off, src, bytes);
            const uint16_t *p = (const uint16_t *)(db + off);
            off += pad256(bytes);
            return p;
        };
        auto qm = [&](const hd_qlinear *q, QMat *m) {
            size_t b = hdc_repack_bytes(q->k, q->n, q->count);
            if (hdc_repack(q->w_q, q->scales, q->zeros, q->k, q->n, q->count,
                           hb + off, db + off, m) != 0 && st == HD_OK)
                st = fail(err, err_size, HD_ERR_BACKEND,
                          "a %d x %d int4 map has a scale or zero the CUDA "
                          "kernel cannot dequantize exactly (non-finite, or "
                          "frac(zero) * scale not a bf16)", q->k, q->n);
            off += b;
        };
        for (int i = 0; i < model->n_layers; i++) {
            const hd_layer *L = &model->layers[i];
            LayerDev *d = &ld[i];
            memset(d, 0, sizeof *d);
            d->kind = L->kind;
            d->slot = L->slot;
            d->attn_norm = raw(L->attn_norm, HD_HIDDEN * 2);
            d->moe_norm = raw(L->moe_norm, HD_HIDDEN * 2);
            if (L->kind == 'K') {
                const hd_kda_weights *w = &L->kda;
                qm(&w->q_proj, &d->p[0]);
                qm(&w->k_proj, &d->p[1]);
                qm(&w->v_proj, &d->p[2]);
                qm(&w->g_proj, &d->p[3]);
                qm(&w->o_proj, &d->p[4]);
                d->beta = raw(w->beta_proj, 32 * HD_HIDDEN * 2);
                d->conv_w = raw(w->conv_w, 3 * 4096 * 4 * 2);
            } else {
                const hd_mla_weights *w = &L->mla;
                qm(&w->q_proj, &d->p[0]);
                qm(&w->kv_a, &d->p[1]);
                qm(&w->kv_b, &d->p[2]);
                qm(&w->o_proj, &d->p[3]);
            }
            d->router = raw(L->moe.router, (size_t)E * HD_HIDDEN * 2);
            qm(&L->moe.gate, &d->gate);
            qm(&L->moe.up, &d->up);
            qm(&L->moe.down, &d->down);
            qm(&L->moe.s_gate, &d->sgate);
            qm(&L->moe.s_up, &d->sup);
            qm(&L->moe.s_down, &d->sdown);
        }
    }
    if (st != HD_OK)
        goto out;
    CK(cudaMemcpy(cm->weights, host.data(), total, cudaMemcpyHostToDevice));
    std::vector<uint8_t>().swap(host);
    CK(cudaMalloc((void **)&cm->layers, sizeof(LayerDev) * model->n_layers));
    CK(cudaMemcpy(cm->layers, ld.data(), sizeof(LayerDev) * model->n_layers,
                  cudaMemcpyHostToDevice));

    /* Scratch (floats): h, act, beta, attn, q, ql, logits, ff, route,
     * parts, dpart, dcnt; then hin, hout (bf16) and the barrier. */
    cm->parts_splits = (size_t)cm->grid;
    nf = HD_HIDDEN + 4 * 4096 + 32 + 4096 + 6144 + 32 * 512 + pad256(E * 4) / 4 +
         9 * 1024 + 16 + cm->parts_splits * 32 * HDC_PART + 9 * HD_HIDDEN + 256;
    CK(cudaMalloc(&cm->scratch, nf * 4 + 2 * HD_HIDDEN * 2 + 256 + 128 * 8 +
                                    (size_t)cm->grid * HDC_TRACE_PTS * 8));
    CK(cudaMemset(cm->scratch, 0, nf * 4 + 2 * HD_HIDDEN * 2 + 256 + 128 * 8 +
                                      (size_t)cm->grid * HDC_TRACE_PTS * 8));
    f = (float *)cm->scratch;
    {
        StepParams &p = cm->base;
        memset(&p, 0, sizeof p);
        p.layers = cm->layers;
        p.n_layers = model->n_layers;
        p.experts = E;
        p.h = f; f += HD_HIDDEN;
        p.act = f; f += 4 * 4096;
        p.beta = f; f += 32;
        p.attn = f; f += 4096;
        p.q = f; f += 6144;
        p.ql = f; f += 32 * 512;
        p.logits = f; f += pad256(E * 4) / 4;
        p.ff = f; f += 9 * 1024;
        p.route = f; f += 16;
        p.parts = f; f += cm->parts_splits * 32 * HDC_PART;
        p.dpart = f; f += 9 * HD_HIDDEN;
        p.dcnt = (unsigned *)f;
        p.flags = p.dcnt + 160; /* dcnt uses 144 of the 256 */
        f += 256;
        p.hin = (const uint16_t *)f;
        p.hout = (uint16_t *)f + HD_HIDDEN;
        p.bar = (unsigned *)((uint16_t *)f + 2 * HD_HIDDEN);
        p.timers = (unsigned long long *)((uint8_t *)p.bar + 256);
        /* HD_CUDA_PREFETCH=1 turns the L2 prefetch of later phases on: since
         * the weights stream through the shared-memory ring it only delays
         * the small loads of each phase's start (measured: docs/PERF-CUDA.md) */
        const char *pf = getenv("HD_CUDA_PREFETCH");
        p.prefetch = pf && strcmp(pf, "1") == 0;
        /* HD_CUDA_PRIME=1 primes the GEMV ring with the next phase's
         * weights before each grid barrier where they are known: measured
         * slower (device call 5 of 2026-12-03: 555 against 532 us at
         * context 4096), so off by default */
        const char *pr = getenv("HD_CUDA_PRIME");
        p.prime = pr && strcmp(pr, "1") == 0 ? 0x3f : 0;
        /* HD_CUDA_PRIME_MASK=M: only the phases whose bits M sets
         * (PrimeWhat in mega.cu: 1 KDA projections, 2 MLA projections,
         * 4 and 8 KDA and MLA o_proj, 16 router, 32 down), to measure
         * each on its own.  None helps alone either (context 4096: 378.7,
         * 372.7, 375.1, 375.3, 382.5 and 376.1 us against 374.9 with
         * none; device call 6 of 2026-12-04's sixth session) */
        const int pm = env_int("HD_CUDA_PRIME_MASK", 0, 0x3f, -1);
        if (pm >= 0)
            p.prime = pm;
        /* HD_CUDA_LATE_PRIME=M (0 .. 15): the phases of mask M (1 KDA
         * projections, 2 MLA projections, 4 router, 8 o_proj) issue their
         * first GEMV's copies once their vector's loads are in, before the
         * norm and the B fragments (gemv_prime_late).  Measured slower, so
         * off: 375 (M = 7) and 384 (15) against 351 us a step at context
         * 4096, each primed phase 2-5 us longer (2026-12-07, an H200;
         * docs/PERF-CUDA.md, twenty-third session) */
#ifndef HDC_LATE_PRIME_DEFAULT
#define HDC_LATE_PRIME_DEFAULT 0
#endif
        p.late_prime = env_int("HD_CUDA_LATE_PRIME", 0, 15, HDC_LATE_PRIME_DEFAULT);
        /* HD_CUDA_FLAGS=0 puts the grid barriers back where the delta rule
         * and the down projections wait for flags (measurements,
         * cross-checks) */
        const char *fl = getenv("HD_CUDA_FLAGS");
        p.use_flags = !(fl && strcmp(fl, "0") == 0);
        /* A down task may update h once every gate/up task is done, which
         * is after every CTA's RMSNorm of h in phase X only while every
         * CTA has such a task (256 of them) */
        if (cm->grid > 256)
            p.use_flags = 0;
        /* The attention runs on tensor cores in 8-head groups, four CTAs a
         * split (cuda_step; context 0: 8.6 us against 21.3 on CUDA cores,
         * 4096: 15.5 against 32.4 with one CTA a split; 2026-12-06, an
         * H100).  HD_CUDA_ATTN=tc forces one CTA a split on tensor cores,
         * =scalar one CTA a split on CUDA cores (measurements,
         * cross-checks); a grid of fewer than 4 CTAs takes one CTA a
         * split, on CUDA cores where a split has at most 64 tokens. */
        const char *at = getenv("HD_CUDA_ATTN");
        p.attn_scalar = at && strcmp(at, "scalar") == 0 ? 1 : at && strcmp(at, "tc") == 0 ? -1 : 0;
        p.trace = getenv("HD_CUDA_TRACE") ? p.timers + 128 : nullptr;
        /* HD_CUDA_SPLIT_MIN=N (32 .. 4096): the fewest tokens a split of
         * the attention takes, 128 unless set.  At context 4096 splits of
         * 32 tokens (129 of them, on CUDA cores) measured 379 us a step,
         * of 128 (33 splits of 125, on tensor cores) 367 us, of 256 (17)
         * 379 us: fewer splits make the merge shorter (19 -> 12 us) by
         * more than the attention grows (27 -> 30 us; device calls 2 and
         * 3 of 2026-12-04's sixth session). */
        cm->split_min = env_int("HD_CUDA_SPLIT_MIN", 32, 4096, 128);
        /* HD_CUDA_MERGE_CTAS=N (1, 2 or 4; 4 unless set): the merge of
         * the attention's splits on N CTAs a head, each with 128 / N of
         * the head's W_v columns, where the grid has 32 N CTAs (else
         * fewer).  Four measured 3-4 us a step faster than one on an
         * H100 (the phase 12.6 against 15.4 us at context 4096) and 1-2
         * us at contexts 4096 and 32768 on an H200 (docs/PERF-CUDA.md,
         * twenty-second and twenty-third sessions). */
#ifndef HDC_MERGE_CTAS_DEFAULT
#define HDC_MERGE_CTAS_DEFAULT 4
#endif
        int mc = env_int("HD_CUDA_MERGE_CTAS", 1, 4, HDC_MERGE_CTAS_DEFAULT);
        mc = mc >= 4 ? 4 : mc >= 2 ? 2 : 1;
        while (mc > 1 && 32 * mc > cm->grid)
            mc >>= 1;
        p.merge_ctas = mc;
    }
    CK(cudaStreamCreateWithFlags(&cm->stream, cudaStreamNonBlocking));
    CK(cudaHostAlloc((void **)&cm->pinned, 2 * HD_HIDDEN * 2, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&cm->hout_dev, cm->pinned + HD_HIDDEN, 0));
    {
        /* HD_CUDA_IO=copy: the input and output through device scratch,
         * one copy each way (measurements, cross-checks) */
        const char *io = getenv("HD_CUDA_IO");
        cm->io_direct = !(io && strcmp(io, "copy") == 0);
    }
    snprintf(model->backend_info, sizeof model->backend_info,
             "cuda (%s, %d CTAs x %d threads, one cooperative launch a step)",
             prop.name, cm->grid, HDC_THREADS);
    model->backend_ctx = cm;
    return HD_OK;
out:
    model_release(cm);
    return st;
}

static void cuda_model_free(hd_model *model)
{
    model_release((CudaModel *)model->backend_ctx);
    model->backend_ctx = NULL;
}

#define S_BYTES ((size_t)32 * 128 * 128 * 4)
#define CONV_BYTES ((size_t)3 * 3 * 4096 * 2)

static void state_release(CudaState *cs)
{
    if (!cs)
        return;
    for (int i = 0; i < HD_MAX_LAYERS; i++) {
        cudaFree(cs->S[i]);
        cudaFree(cs->conv[i]);
        cudaFree(cs->ckv[i]);
        cudaFree(cs->krope[i]);
    }
    cudaFree(cs->ptrs);
    delete cs;
}

static hd_status cuda_state_init(hd_state *state)
{
    const hd_model *m = state->model;
    CudaModel *cm = (CudaModel *)m->backend_ctx;
    CudaState *cs = new CudaState();
    size_t rows = state->capacity ? state->capacity : 1;
    void *host[4 * HD_MAX_LAYERS];

    memset(cs, 0, sizeof *cs);
    if (cudaSetDevice(cm->device) != cudaSuccess)
        goto fail;
    for (int i = 0; i < m->n_layers; i++) {
        int s = m->layers[i].slot;
        if (m->layers[i].kind == 'K') {
            if (cudaMalloc((void **)&cs->S[s], S_BYTES) != cudaSuccess ||
                cudaMalloc((void **)&cs->conv[s], CONV_BYTES) != cudaSuccess ||
                cudaMemset(cs->S[s], 0, S_BYTES) != cudaSuccess ||
                cudaMemset(cs->conv[s], 0, CONV_BYTES) != cudaSuccess)
                goto fail;
        } else {
            if (cudaMalloc((void **)&cs->ckv[s], rows * 512 * 2) != cudaSuccess ||
                cudaMalloc((void **)&cs->krope[s], rows * 64 * 2) != cudaSuccess)
                goto fail;
        }
    }
    for (int i = 0; i < HD_MAX_LAYERS; i++) {
        host[i] = cs->S[i];
        host[HD_MAX_LAYERS + i] = cs->conv[i];
        host[2 * HD_MAX_LAYERS + i] = cs->ckv[i];
        host[3 * HD_MAX_LAYERS + i] = cs->krope[i];
    }
    if (cudaMalloc(&cs->ptrs, sizeof host) != cudaSuccess ||
        cudaMemcpy(cs->ptrs, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess)
        goto fail;
    state->impl = cs;
    return HD_OK;
fail:
    state_release(cs);
    return HD_ERR_OUT_OF_MEMORY;
}

static void cuda_state_free(hd_state *state)
{
    CudaModel *cm = (CudaModel *)state->model->backend_ctx;
    cudaSetDevice(cm->device);
    state_release((CudaState *)state->impl);
    state->impl = NULL;
}

static hd_status cuda_state_reset(hd_state *state)
{
    const hd_model *m = state->model;
    CudaState *cs = (CudaState *)state->impl;
    cudaSetDevice(((CudaModel *)m->backend_ctx)->device);
    for (int i = 0; i < m->n_kda; i++)
        if (cudaMemset(cs->S[i], 0, S_BYTES) != cudaSuccess ||
            cudaMemset(cs->conv[i], 0, CONV_BYTES) != cudaSuccess)
            return HD_ERR_BACKEND;
    return HD_OK;
}

static void *locate(const hd_state *state, int layer, hd_state_tensor which,
                    size_t rows, size_t *bytes)
{
    CudaState *cs = (CudaState *)state->impl;
    int slot = state->model->layers[layer].slot;
    const size_t one = (size_t)3 * 4096;
    switch (which) {
    case HD_STATE_S:
        *bytes = S_BYTES;
        return cs->S[slot];
    case HD_STATE_CONV_Q:
    case HD_STATE_CONV_K:
    case HD_STATE_CONV_V:
        *bytes = one * 2;
        return cs->conv[slot] + (size_t)(which - HD_STATE_CONV_Q) * one;
    case HD_STATE_C_KV:
        *bytes = rows * 512 * 2;
        return cs->ckv[slot];
    case HD_STATE_K_ROPE:
        *bytes = rows * 64 * 2;
        return cs->krope[slot];
    }
    return NULL;
}

static hd_status cuda_state_read(const hd_state *state, int layer,
                                 hd_state_tensor which, size_t rows, void *dst)
{
    size_t bytes = 0;
    void *p = locate(state, layer, which, rows, &bytes);
    if (!p)
        return HD_ERR_INTERNAL;
    cudaSetDevice(((CudaModel *)state->model->backend_ctx)->device);
    return cudaMemcpy(dst, p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess
               ? HD_OK : HD_ERR_BACKEND;
}

static hd_status cuda_state_write(hd_state *state, int layer,
                                  hd_state_tensor which, size_t rows,
                                  const void *src)
{
    size_t bytes = 0;
    void *p = locate(state, layer, which, rows, &bytes);
    if (!p)
        return HD_ERR_INTERNAL;
    cudaSetDevice(((CudaModel *)state->model->backend_ctx)->device);
    return cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess
               ? HD_OK : HD_ERR_BACKEND;
}

/* HD_CUDA_PHASES=1: the time of every phase of the last step (CTA 0's view,
 * barrier to barrier), to stderr. */
static void print_phases(const hd_model *model, const StepParams *p,
                         cudaStream_t stream)
{
    static const char *const kda[] = {"proj", "delta", "o_proj", "router", "experts", "down"};
    static const char *const mla[] = {"proj", "absorb", "attend", "merge", "o_proj",
                                      "router", "experts", "down"};
    unsigned long long t[128];
    int k = 1;
    if (cudaMemcpyAsync(t, p->timers, sizeof t, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        return;
    fprintf(stderr, "phases (us):");
    for (int l = 0; l < model->n_layers && k < 128; l++) {
        bool K = model->layers[l].kind == 'K';
        int n = K ? 6 : 8;
        for (int i = 0; i < n && k < 128; i++, k++)
            fprintf(stderr, " %d%c.%s=%.1f", l, model->layers[l].kind, K ? kda[i] : mla[i],
                    (double)(t[k] - t[k - 1]) * 1e-3);
    }
    fprintf(stderr, " total=%.1f\n", (double)(t[k - 1] - t[0]) * 1e-3);
    if (p->trace) {
        CudaModel *cm = (CudaModel *)model->backend_ctx;
        std::vector<unsigned long long> tr((size_t)cm->grid * HDC_TRACE_PTS);
        if (cudaMemcpy(tr.data(), p->trace, tr.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
            return;
        unsigned long long t0 = ~0ull;
        for (int b = 0; b < cm->grid; b++)
            if (tr[(size_t)b * HDC_TRACE_PTS] && tr[(size_t)b * HDC_TRACE_PTS] < t0)
                t0 = tr[(size_t)b * HDC_TRACE_PTS];
        /* per point: the earliest, median and last CTA's times, how many
         * CTAs reached it, which was last, and how many came more than
         * 1 us after the median (a phase waits for its last CTA) */
        fprintf(stderr, "trace (us from the first CTA at point 0: min med max (CTAs, the last, "
                        "late by > 1 us)):");
        for (int id = 0; id < HDC_TRACE_PTS; id++) {
            std::vector<double> v;
            int last = -1;
            double tl = -1.0;
            for (int b = 0; b < cm->grid; b++)
                if (tr[(size_t)b * HDC_TRACE_PTS + id] >= t0 && tr[(size_t)b * HDC_TRACE_PTS + id]) {
                    v.push_back((double)(tr[(size_t)b * HDC_TRACE_PTS + id] - t0) * 1e-3);
                    if (v.back() > tl) {
                        tl = v.back();
                        last = b;
                    }
                }
            if (v.empty())
                continue;
            std::sort(v.begin(), v.end());
            const double med = v[v.size() / 2];
            size_t late = 0;
            for (double x : v)
                late += x > med + 1.0;
            fprintf(stderr, " [%d] %.1f %.1f %.1f (%zu, %d, %zu)", id, v.front(), med, v.back(),
                    v.size(), last, late);
        }
        fprintf(stderr, "\n");
        cudaMemset(p->trace, 0, tr.size() * 8);
        unsigned long long g[4][64];
        if (hdc_gemv_trace(&g[0][0], 0) == cudaSuccess && g[0][0]) {
            fprintf(stderr, "gemv trace (CTA 5, call HD_CUDA_TRACE, %llu blocks; us: issued / warp0 sees / warp15 sees / warp15 done):", g[0][63]);
            for (int jb = 0; jb < (int)g[0][63] && jb < 63; jb++)
                fprintf(stderr, " [%d] %.2f %.2f %.2f %.2f", jb, (double)(g[0][jb] - g[0][0]) * 1e-3,
                        (double)(g[1][jb] - g[0][0]) * 1e-3, (double)(g[2][jb] - g[0][0]) * 1e-3,
                        (double)(g[3][jb] - g[0][0]) * 1e-3);
            fprintf(stderr, "\n");
        }
    }
}

static_assert(sizeof(StepParams::hin_v) == HD_HIDDEN * 2, "the input in the parameters");

static hd_status cuda_step(const hd_model *model, hd_state *state,
                           const uint16_t *in, uint16_t *out)
{
    CudaModel *cm = (CudaModel *)model->backend_ctx;
    CudaState *cs = (CudaState *)state->impl;
    StepParams p = cm->base;
    cudaError_t e;
    size_t T = state->context + 1;

    p.S = (float *const *)cs->ptrs;
    p.conv = (uint16_t *const *)((void **)cs->ptrs + HD_MAX_LAYERS);
    p.ckv = (uint16_t *const *)((void **)cs->ptrs + 2 * HD_MAX_LAYERS);
    p.krope = (uint16_t *const *)((void **)cs->ptrs + 3 * HD_MAX_LAYERS);
    p.pos = (int)state->context;
    if (state->context > (size_t)0x7fffffff - 64)
        return HD_ERR_BACKEND;
    /* Splits of at least split_min tokens, at most one per CTA; four CTAs
     * a split (8 heads each, mla_attend_tc8) unless HD_CUDA_ATTN forces
     * one kind, and at most a quarter of the grid's splits, longer where
     * there would be more.  Measured (E 256, an H100, two modules
     * alternating): at context 8192, 33 splits of 249 tokens with four
     * CTAs each took 376.9-377.6 us a step, 65 splits of 127 with one
     * CTA each 393.1-394.5; at 12288 387-394 against 399-403 (97 splits
     * of one CTA), at 16384 395-400 against 406-410 (129), at 32768
     * 423-427 against 426-430 (132); fewer splits than a quarter of the
     * grid were slower everywhere (docs/PERF-CUDA.md, twentieth and
     * twenty-first sessions). */
    {
        const size_t mn = (size_t)cm->split_min, quarter = (size_t)cm->grid / 4;
        size_t ns = (T + mn - 1) / mn;
        if (ns > (size_t)cm->grid)
            ns = (size_t)cm->grid;
        p.hsplit = 1;
        if (p.attn_scalar == 0 && quarter > 0) {
            p.hsplit = 4;
            if (ns > quarter)
                ns = quarter;
        }
        p.nsplit = (int)ns;
        p.split_len = (int)((T + ns - 1) / ns);
    }
    pthread_mutex_lock(&step_lock);
    const bool timed = getenv("HD_CUDA_PHASES") != nullptr;
    cudaEvent_t ev[4] = {nullptr, nullptr, nullptr, nullptr};
    struct timespec w0, w1;
    e = cudaSetDevice(cm->device);
    if (e == cudaSuccess && timed)
        for (int i = 0; i < 4 && e == cudaSuccess; i++)
            e = cudaEventCreate(&ev[i]);
    clock_gettime(CLOCK_MONOTONIC, &w0);
    if (e == cudaSuccess && timed)
        e = cudaEventRecord(ev[0], cm->stream);
    if (cm->io_direct) { /* else p.hin and p.hout are cm->base's scratch */
        memcpy(p.hin_v, in, HD_HIDDEN * 2);
        p.hin = nullptr;
        p.hout = cm->hout_dev;
    } else {
        memcpy(cm->pinned, in, HD_HIDDEN * 2);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync((void *)p.hin, cm->pinned, HD_HIDDEN * 2,
                                cudaMemcpyHostToDevice, cm->stream);
    }
    if (e == cudaSuccess && p.trace && timed) {
        /* HD_CUDA_TRACE=N: also the ring events of CTA 5's N-th GEMV call
         * (1 when N is not a number).  N = 0: the CTAs' points alone
         * (recording the ring's events makes CTA 5 the last CTA of
         * several phases: docs/PERF-CUDA.md, twenty-fourth session) */
        const int gn = env_int("HD_CUDA_TRACE", 0, 1 << 20, 1);
        if (gn > 0)
            e = hdc_gemv_trace(nullptr, gn);
    }
    if (e == cudaSuccess && timed)
        e = cudaEventRecord(ev[1], cm->stream);
    if (e == cudaSuccess)
        e = hdc_launch(&p, cm->grid, cm->stream);
    if (e == cudaSuccess && timed)
        e = cudaEventRecord(ev[2], cm->stream);
    if (e == cudaSuccess && !cm->io_direct)
        e = cudaMemcpyAsync(cm->pinned + HD_HIDDEN, p.hout, HD_HIDDEN * 2,
                            cudaMemcpyDeviceToHost, cm->stream);
    if (e == cudaSuccess && timed)
        e = cudaEventRecord(ev[3], cm->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cm->stream);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    /* the kernel's writes to mapped memory are visible once the stream
     * has synchronized */
    if (e == cudaSuccess)
        memcpy(out, cm->pinned + HD_HIDDEN, HD_HIDDEN * 2);
    if (e == cudaSuccess && timed) {
        float ms[3] = {0.0f, 0.0f, 0.0f};
        for (int i = 0; i < 3; i++)
            cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]);
        fprintf(stderr, "step (us, %s io): wall %.1f; events: input %.1f, launch to kernel end %.1f, output %.1f\n",
                cm->io_direct ? "direct" : "copy",
                (double)(w1.tv_sec - w0.tv_sec) * 1e6 + (double)(w1.tv_nsec - w0.tv_nsec) * 1e-3,
                ms[0] * 1e3, ms[1] * 1e3, ms[2] * 1e3);
        print_phases(model, &p, cm->stream);
    }
    for (int i = 0; i < 4; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (e != cudaSuccess) {
        /* Put the barrier and the down counters back at rest for a later
         * launch. */
        cudaMemsetAsync(p.bar, 0, 16, cm->stream);
        cudaMemsetAsync(p.dcnt, 0, 256 * 4, cm->stream);
        cudaStreamSynchronize(cm->stream);
        fprintf(stderr, "libhd cuda: step failed: %s\n", cudaGetErrorString(e));
    }
    pthread_mutex_unlock(&step_lock);
    return e == cudaSuccess ? HD_OK : HD_ERR_BACKEND;
}

/* Device-to-device copy bandwidth, read + write counted, best of 5. */
static hd_status cuda_measure_bandwidth(const hd_model *model, double *bps)
{
    CudaModel *cm = (CudaModel *)model->backend_ctx;
    const size_t bytes = (size_t)512 << 20;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float best = 0.0f;
    hd_status st = HD_ERR_BACKEND;

    pthread_mutex_lock(&step_lock);
    if (cudaSetDevice(cm->device) != cudaSuccess ||
        cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaMemset(a, 1, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    for (int r = 0; r < 5; r++) {
        float ms = 0.0f;
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        if (cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            goto out;
        if (ms > 0.0f && (best == 0.0f || ms < best))
            best = ms;
    }
    if (best > 0.0f) {
        *bps = 2.0 * (double)bytes / (best * 1e-3);
        st = HD_OK;
    }
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    pthread_mutex_unlock(&step_lock);
    return st;
}

static const hd_backend_ops cuda_ops = {
    HD_BACKEND_CUDA,
    "cuda",
    cuda_probe,
    cuda_model_init,
    cuda_model_free,
    cuda_state_init,
    cuda_state_free,
    cuda_state_reset,
    cuda_state_read,
    cuda_state_write,
    cuda_step,
    cuda_measure_bandwidth,
};

EXPORT const hd_backend_ops *hd_cuda_module_v1(int libhd_abi, int *abi)
{
    if (abi)
        *abi = HD_CUDA_MODULE_ABI;
    return libhd_abi == HD_CUDA_MODULE_ABI ? &cuda_ops : NULL;
}
