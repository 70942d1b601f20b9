/*
 * hd-bench - how fast a backend runs a decode step, next to how fast this
 * machine reads memory, measured in the same run.
 *
 * Step mode (default): the synthetic model (seed 1) for E experts, the MLA
 * caches prefilled to a context, warm-up steps, then timed steps; prints
 * the median microseconds per step, the bytes a step must move
 * (hd_model_step_bytes), the read bandwidth measured before and after the
 * steps (hd_model_measure_bandwidth: >= 1 GiB read with the backend's
 * threads) and the fraction of that bandwidth the step achieves.
 *
 * GEMV mode (--gemv, CPU backend): the four int4 shapes of a step, each
 * with its weights cold (rotating through >= 512 MiB of copies), against a
 * plain read of the same bytes with the same threads; x exactly bf16 (the
 * normed inputs), or with --x32 fp32 (the expert down and W_v inputs),
 * which adds W_v's shape.
 *
 * MLA mode (--mla, CPU backend): the attention's softmax partials of one
 * MLA layer (the kernels' mla_range: the scores, the softmax and the
 * weighted sum of the cache rows, all 32 heads) over a cache of --context
 * tokens cold (rotating through >= 256 MiB of cache copies), the tokens
 * split across the threads as a step splits them.
 *
 * A benchmark, not a test: it asserts nothing about times.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "hd.h"
#ifdef HD_HAVE_CPU_BACKEND
#include "cpu/cpu.h"
#include "util.h"
#endif

typedef struct bench_config {
    hd_backend backend;
    int experts;
    size_t context;
    int steps, warmup, threads;
    int json, gemv, x32, mla;
} bench_config;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: hd-bench [options]\n"
        "Time decode steps (or the int4 GEMVs) against the memory bandwidth\n"
        "measured in the same run.\n\n"
        "  --backend B     auto, ref, cpu or cuda (default: HD_BACKEND, else auto)\n"
        "  --experts E     routed experts of the synthetic model (default 256)\n"
        "  --context L     MLA context before the first step (default 4096)\n"
        "  --steps N       timed steps (default 20)\n"
        "  --warmup N      untimed steps first (default 3)\n"
        "  --threads N     CPU threads, 0 = OMP_NUM_THREADS or all cores (default 0)\n"
        "  --gemv          cold GEMV microbenchmark of the four int4 shapes against\n"
        "                  a plain read of the same bytes (CPU backend)\n"
        "  --x32           with --gemv: x fp32, not bf16 (the expert down and W_v\n"
        "                  inputs), and W_v's shape (32 x 512 x 128 as 512 x 4096) too\n"
        "  --mla           cold MLA attention microbenchmark: the softmax partials\n"
        "                  over --context cache rows (CPU backend)\n"
        "  --json          print one JSON object instead of the table\n"
        "  -h, --help      this help\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, bench_config *c)
{
    enum { O_BACKEND = 256, O_EXPERTS, O_CONTEXT, O_STEPS, O_WARMUP, O_THREADS,
           O_JSON, O_GEMV, O_X32, O_MLA };
    static const struct option opts[] = {
        {"backend", required_argument, NULL, O_BACKEND},
        {"experts", required_argument, NULL, O_EXPERTS},
        {"context", required_argument, NULL, O_CONTEXT},
        {"steps", required_argument, NULL, O_STEPS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"threads", required_argument, NULL, O_THREADS},
        {"json", no_argument, NULL, O_JSON},
        {"gemv", no_argument, NULL, O_GEMV},
        {"x32", no_argument, NULL, O_X32},
        {"mla", no_argument, NULL, O_MLA},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    long v;
    int o;
    c->backend = HD_BACKEND_DEFAULT;
    c->experts = 256;
    c->context = 4096;
    c->steps = 20;
    c->warmup = 3;
    c->threads = 0;
    c->json = c->gemv = c->x32 = c->mla = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case O_BACKEND:
            if (hd_backend_parse(optarg, &c->backend) != HD_OK)
                goto bad;
            break;
        case O_EXPERTS:
            if (parse_int(optarg, HD_MIN_EXPERTS, HD_MAX_EXPERTS, &v))
                goto bad;
            c->experts = (int)v;
            break;
        case O_CONTEXT:
            if (parse_int(optarg, 0, 1L << 24, &v))
                goto bad;
            c->context = (size_t)v;
            break;
        case O_STEPS:
            if (parse_int(optarg, 1, 1000000, &v))
                goto bad;
            c->steps = (int)v;
            break;
        case O_WARMUP:
            if (parse_int(optarg, 0, 1000000, &v))
                goto bad;
            c->warmup = (int)v;
            break;
        case O_THREADS:
            if (parse_int(optarg, 0, 4096, &v))
                goto bad;
            c->threads = (int)v;
            break;
        case O_JSON:
            c->json = 1;
            break;
        case O_GEMV:
            c->gemv = 1;
            break;
        case O_X32:
            c->x32 = 1;
            break;
        case O_MLA:
            c->mla = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            goto bad;
        }
    }
    if (optind == argc)
        return 0;
bad:
    fprintf(stderr, "hd-bench: invalid arguments (try --help)\n");
    return -1;
}

/* ---- step mode ------------------------------------------------------------ */

static int run_steps(const bench_config *c)
{
    hd_options opt;
    hd_model *m = NULL;
    hd_state *st = NULL;
    char err[256] = "";
    uint16_t in[HD_HIDDEN], out[HD_HIDDEN];
    double bw0 = 0, bw1 = 0, *t;
    hd_status s;
    int n_mla = 0;

    hd_options_init(&opt);
    opt.backend = c->backend;
    opt.threads = c->threads;
    s = hd_model_synth(1, c->experts, NULL, &opt, &m, err, sizeof err);
    if (s != HD_OK) {
        fprintf(stderr, "hd-bench: model: %s\n", err);
        return 1;
    }
    for (const char *p = hd_model_pattern(m); *p; p++)
        n_mla += *p == 'M';
    s = hd_state_new(m, c->context + (size_t)c->warmup + (size_t)c->steps + 1, &st);
    if (s == HD_OK && c->context) {
        size_t rows = c->context * (size_t)(n_mla ? n_mla : 1);
        uint16_t *ckv = malloc(rows * HD_MLA_KV_LORA * 2);
        uint16_t *kr = malloc(rows * HD_MLA_QK_ROPE * 2);
        s = ckv && kr ? HD_OK : HD_ERR_OUT_OF_MEMORY;
        for (int i = 0; s == HD_OK && i < n_mla; i++)
            s = hd_synth_cache(1 + (uint32_t)i, c->context,
                               ckv + (size_t)i * c->context * HD_MLA_KV_LORA,
                               kr + (size_t)i * c->context * HD_MLA_QK_ROPE);
        if (s == HD_OK)
            s = hd_state_prefill(st, c->context, ckv, kr);
        free(ckv);
        free(kr);
    }
    t = malloc((size_t)c->steps * sizeof *t);
    if (s != HD_OK || !t) {
        fprintf(stderr, "hd-bench: state: %s\n", hd_status_string(s));
        return 1;
    }
    if (hd_model_measure_bandwidth(m, &bw0) != HD_OK)
        bw0 = 0;
    for (int i = 0; i < c->warmup + c->steps; i++) {
        double t0;
        hd_synth_input(1, (uint64_t)i, in);
        t0 = now_s();
        s = hd_step(m, st, in, out);
        if (s != HD_OK) {
            fprintf(stderr, "hd-bench: step: %s\n", hd_status_string(s));
            return 1;
        }
        if (i >= c->warmup)
            t[i - c->warmup] = now_s() - t0;
    }
    if (hd_model_measure_bandwidth(m, &bw1) != HD_OK)
        bw1 = 0;
    {
        const double us = median(t, c->steps) * 1e6;
        const double bytes = (double)hd_model_step_bytes(m, c->context);
        const double bw = 0.5 * (bw0 + bw1);
        const double floor_us = bw > 0 ? bytes / bw * 1e6 : 0;
        const double frac = us > 0 ? floor_us / us : 0;
        if (c->json) {
            printf("{\"backend\": \"%s\", \"backend_info\": \"%s\", \"experts\": %d, "
                   "\"context\": %zu, \"threads\": %d, \"steps\": %d, \"warmup\": %d, "
                   "\"step_us_median\": %.1f, \"step_us_min\": %.1f, "
                   "\"bytes_per_step\": %.0f, \"membw_GBps\": %.2f, "
                   "\"membw_before_GBps\": %.2f, \"membw_after_GBps\": %.2f, "
                   "\"floor_us\": %.1f, \"fraction_of_bandwidth\": %.3f}\n",
                   hd_backend_name(hd_model_backend(m)), hd_model_backend_info(m),
                   c->experts, c->context, c->threads, c->steps, c->warmup, us,
                   t[0] * 1e6, bytes, bw / 1e9, bw0 / 1e9, bw1 / 1e9, floor_us, frac);
        } else {
            printf("backend            %s\n", hd_model_backend_info(m));
            printf("experts / context  %d / %zu\n", c->experts, c->context);
            printf("steps (warm-up)    %d (%d)\n", c->steps, c->warmup);
            printf("step median        %.1f us   (min %.1f us)\n", us, t[0] * 1e6);
            printf("bytes per step     %.1f MB\n", bytes / 1e6);
            printf("read bandwidth     %.1f GB/s   (before %.1f, after %.1f)\n",
                   bw / 1e9, bw0 / 1e9, bw1 / 1e9);
            printf("bandwidth floor    %.1f us\n", floor_us);
            printf("fraction of bw     %.1f %%   (step / floor = %.2f x)\n",
                   100 * frac, frac > 0 ? 1 / frac : 0);
        }
    }
    free(t);
    hd_state_free(st);
    hd_model_free(m);
    return 0;
}

/* ---- GEMV mode ------------------------------------------------------------ */
#ifdef HD_HAVE_CPU_BACKEND
static uint32_t rng_next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static int run_gemv(const bench_config *c)
{
    static const int shapes[5][2] = { { 4096, 2304 }, { 2304, 4096 },
                                      { 1024, 2304 }, { 2304, 1024 },
                                      { 512, 4096 } };
    const int n_shapes = c->x32 ? 5 : 4;
    cpu_isa isa;
    char err[256];
    const cpu_kernels *kern;
    const char *x_layout;
    int threads;
    double bw = 0;
    double ratio[5], g_us[5], r_us[5];
    size_t bytes_of[5];
    int copies_of[5];

    if (cpu_choose_isa(&isa, err, sizeof err) != HD_OK) {
        fprintf(stderr, "hd-bench: %s\n", err);
        return 1;
    }
    kern = cpu_kernels_for(isa);
    /* which of x's layouts (cpu.h) the kernels take */
    x_layout = c->x32 ? (kern->gemv_pairs_x3 ? "xt" : kern->gemv_pairs_f32 ? "xe" : "xd")
                      : (kern->gemv_pairs_x1 ? "xt" : kern->gemv_pairs_bf16 ? "xb" : "xd");
    threads = cpu_resolve_threads(c->threads);
    hd_host_read_bandwidth((size_t)1 << 30, threads, 3, &bw);
    for (int sh = 0; sh < n_shapes; sh++) {
        const int K = shapes[sh][0], N = shapes[sh][1];
        cpu_qmat proto;
        uint8_t *w_q = malloc((size_t)K / 2 * (size_t)N);
        uint16_t *sc = malloc((size_t)K / 128 * (size_t)N * 2);
        uint16_t *ze = malloc((size_t)K / 128 * (size_t)N * 2);
        float *x = malloc((size_t)K * sizeof(float)), *y = malloc((size_t)N * sizeof(float));
        /* every layout of x, as a step's vectors have: x is exactly bf16
         * (below), as a step's normed inputs are, so kernels with a bf16
         * GEMV use its words; with --x32 x is fp32 (24 significant bits),
         * as the down and W_v inputs are */
        /* the layouts a step gives the kernels (cpu_prepare_x writes the
         * xd floats only for an x that none of the others carries) */
        int has_xb, has_xe, has_xt;
        cpu_xq_layouts(kern, &has_xb, &has_xe, &has_xt);
        cpu_xq xq = { malloc((size_t)K * 2 * sizeof(float)),
                      has_xb ? malloc((size_t)K * sizeof(uint16_t)) : NULL,
                      has_xe ? malloc((size_t)K * sizeof(float)) : NULL,
                      has_xt ? malloc((size_t)K * 3 * sizeof(uint16_t)) : NULL, K, 0, 0, 0, 0 };
        uint32_t rng = 12345u + (uint32_t)sh;
        size_t bytes, per;
        int copies;
        uint8_t *all;
        double best_g = 1e30, best_r = 1e30;
        uint64_t sink = 0;
        uint64_t *ctr; /* [copies][threads]: each copy's run words */

        if (!w_q || !sc || !ze || !x || !y || !xq.xd || (has_xb && !xq.xb) || (has_xe && !xq.xe) ||
            (has_xt && !xq.xt) ||
            cpu_qmat_alloc(&proto, K, N, 1, kern->layout) != HD_OK) {
            fprintf(stderr, "hd-bench: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < (size_t)K / 2 * (size_t)N; i++)
            w_q[i] = (uint8_t)rng_next(&rng);
        for (size_t i = 0; i < (size_t)K / 128 * (size_t)N; i++) {
            sc[i] = (uint16_t)(((127 - 9) << 7) | (rng_next(&rng) & 127));
            ze[i] = hd_f32_to_bf16(7.0f + 0.5f * (float)(rng_next(&rng) & 3));
        }
        for (int i = 0; i < K; i++)
            x[i] = c->x32 ? (float)((int)(rng_next(&rng) & 0xffffff) - 0x800000) / 0x400000
                          : (float)((int)(rng_next(&rng) & 255) - 128) / 64.0f;
        cpu_prepare_x(x, K, &xq);
        cpu_repack_raw(&proto, 0, w_q, sc, ze);
        per = proto.member_tiles * CPU_TILE_BYTES;
        per = (per + 4095) & ~(size_t)4095;
        copies = (int)(((size_t)512 << 20) / per) + 1;
        bytes = per * (size_t)copies;
        all = hd_alloc_aligned(bytes);
        if (!all) {
            fprintf(stderr, "hd-bench: out of memory (%zu bytes)\n", bytes);
            return 1;
        }
        for (int i = 0; i < copies; i++)
            memcpy(all + (size_t)i * per, proto.tiles, proto.member_tiles * CPU_TILE_BYTES);
        ctr = calloc((size_t)copies * (size_t)threads, sizeof *ctr);
        if (!ctr) {
            fprintf(stderr, "hd-bench: out of memory\n");
            return 1;
        }
        /* Both loops run as one parallel region over the copies, with the
         * step's scheduling: each copy cut into the same chunks of column
         * pairs, handed out by cpu_sweep_next, and a cpu_barrier after each copy
         * (as after each sweep of a step); the read sums the chunk's bytes
         * instead of multiplying them.  So the ratio compares the kernel
         * with memory, not two ways of sharing the work. */
        for (int rep = 0; rep < 4; rep++) {
            double t0 = now_s(), dt;
            cpu_bar bar = { 0, 0, 0 };
            memset(ctr, 0, (size_t)copies * (size_t)threads * sizeof *ctr);
#pragma omp parallel num_threads(threads)
            for (int i = 0; i < copies; i++) {
                cpu_job job = { all + (size_t)i * per, proto.pairs, proto.groups, &xq, 0,
                                proto.normal };
                cpu_gemv_multi(kern, &job, 1, y, ctr + (size_t)i * (size_t)threads, &bar);
            }
            dt = (now_s() - t0) / copies;
            if (dt < best_g)
                best_g = dt;
            memset(ctr, 0, (size_t)copies * (size_t)threads * sizeof *ctr);
            t0 = now_s();
#pragma omp parallel num_threads(threads)
            {
                int t = 0, nt = 1;
                uint64_t s = 0;
#ifdef _OPENMP
                t = omp_get_thread_num();
                nt = omp_get_num_threads();
#endif
                for (int i = 0; i < copies; i++) {
                    const uint8_t *p = all + (size_t)i * per;
                    const size_t total = (size_t)proto.pairs;
                    const size_t pair_bytes = (size_t)proto.groups * CPU_TILE_BYTES;
                    const size_t chunk = cpu_gemv_chunk(total, nt);
                    size_t k;
                    while (cpu_sweep_next(ctr + (size_t)i * (size_t)threads,
                                          (total + chunk - 1) / chunk, t, nt, &k)) {
                        size_t lo = k * chunk, hi = lo + chunk < total ? lo + chunk : total;
                        s += hd_host_read_sum((const uint64_t *)(const void *)(p + lo * pair_bytes),
                                        (hi - lo) * pair_bytes / 8);
                    }
                    cpu_barrier(&bar, nt);
                }
#pragma omp atomic
                sink += s;
            }
            dt = (now_s() - t0) / copies;
            if (dt < best_r)
                best_r = dt;
        }
        free(ctr);
        g_us[sh] = best_g * 1e6;
        r_us[sh] = best_r * 1e6;
        ratio[sh] = best_g / best_r;
        bytes_of[sh] = proto.member_tiles * CPU_TILE_BYTES;
        copies_of[sh] = copies;
        __asm__ volatile("" : : "r"(sink)); /* keep the reads */
        hd_free_aligned(all);
        cpu_qmat_free(&proto);
        free(w_q);
        free(sc);
        free(ze);
        free(x);
        free(y);
        free(xq.xd);
        free(xq.xb);
        free(xq.xe);
        free(xq.xt);
    }
    {
        double bw1 = 0;
        hd_host_read_bandwidth((size_t)1 << 30, threads, 3, &bw1);
        if (c->json) {
            printf("{\"mode\": \"gemv\", \"backend\": \"cpu\", \"isa\": \"%s\", \"threads\": %d, "
                   "\"x\": \"%s\", \"x_layout\": \"%s\", \"membw_before_GBps\": %.2f, "
                   "\"membw_after_GBps\": %.2f, \"shapes\": [", kern->name, threads,
                   c->x32 ? "fp32" : "bf16", x_layout,
                   bw / 1e9, bw1 / 1e9);
            for (int sh = 0; sh < n_shapes; sh++)
                printf("%s{\"k\": %d, \"n\": %d, \"bytes\": %zu, \"copies\": %d, "
                       "\"gemv_us\": %.1f, \"read_us\": %.1f, \"ratio\": %.3f}",
                       sh ? ", " : "", shapes[sh][0], shapes[sh][1], bytes_of[sh],
                       copies_of[sh], g_us[sh], r_us[sh], ratio[sh]);
            printf("]}\n");
        } else {
            printf("cold int4 GEMV, cpu (%s, %d threads, x %s, layout %s); read bandwidth "
                   "%.1f GB/s before, %.1f after\n", kern->name, threads,
                   c->x32 ? "fp32" : "bf16", x_layout,
                   bw / 1e9, bw1 / 1e9);
            printf("%-12s %10s %8s %11s %11s %10s %7s\n", "K x N", "bytes", "copies",
                   "gemv us", "read us", "gemv GB/s", "ratio");
            for (int sh = 0; sh < n_shapes; sh++)
                printf("%4d x %-5d %10zu %8d %11.1f %11.1f %10.1f %7.2f\n", shapes[sh][0],
                       shapes[sh][1], bytes_of[sh], copies_of[sh], g_us[sh], r_us[sh],
                       (double)bytes_of[sh] / g_us[sh] / 1e3, ratio[sh]);
        }
    }
    return 0;
}

/* The MLA attention's partials over a cold cache of c->context tokens:
 * random bf16 rows, an fp32 query of 24 significant bits, each thread its
 * share of the tokens as in cpu_mla, a barrier after each copy. */
static int run_mla(const bench_config *c)
{
    const int LR = HD_MLA_KV_LORA, RP = HD_MLA_QK_ROPE, NH = HD_MLA_HEADS;
    const size_t L = c->context;
    cpu_isa isa;
    char err[256];
    if (cpu_choose_isa(&isa, err, sizeof err) != HD_OK) {
        fprintf(stderr, "hd-bench: %s\n", err);
        return 1;
    }
    if (L == 0) {
        fprintf(stderr, "hd-bench: --mla needs a context of at least one token\n");
        return 2;
    }
    const cpu_kernels *kern = cpu_kernels_for(isa);
    const int threads = cpu_resolve_threads(c->threads);
    const size_t row = (size_t)(LR + RP) * 2;
    const size_t per = (L * row + 4095) & ~(size_t)4095;
    const int copies = (int)(((size_t)256 << 20) / per) + 1;
    const size_t work = cpu_mla_work(kern);
    uint8_t *all = hd_alloc_aligned(per * (size_t)copies);
    float *ql = malloc((size_t)NH * LR * sizeof(float));
    float *qr = malloc((size_t)NH * RP * sizeof(float));
    float *part = hd_alloc_aligned((size_t)threads * (2 * NH + (size_t)NH * LR + work) * sizeof(float));
    uint32_t rng = 777u;
    double best = 1e30, bw = 0;

    if (!all || !ql || !qr || !part) {
        fprintf(stderr, "hd-bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < L * (size_t)(LR + RP); i++) {
        const uint16_t v = hd_f32_to_bf16((float)((int)(rng_next(&rng) & 0xffff) - 0x8000) / 0x8000);
        memcpy(all + 2 * i, &v, 2);
    }
    for (int i = 1; i < copies; i++)
        memcpy(all + (size_t)i * per, all, L * row);
    for (int i = 0; i < NH * LR; i++)
        ql[i] = (float)((int)(rng_next(&rng) & 0xffffff) - 0x800000) / 0x800000;
    for (int i = 0; i < NH * RP; i++)
        qr[i] = hd_bf((float)((int)(rng_next(&rng) & 0xffff) - 0x8000) / 0x8000);
    hd_host_read_bandwidth((size_t)1 << 30, threads, 3, &bw);
    for (int rep = 0; rep < 4; rep++) {
        cpu_bar bar = { 0, 0, 0 };
        const double t0 = now_s();
#pragma omp parallel num_threads(threads)
        {
            int t = 0, nt = 1;
#ifdef _OPENMP
            t = omp_get_thread_num();
            nt = omp_get_num_threads();
#endif
            float *m = part + (size_t)t * (2 * NH + (size_t)NH * LR + work);
            float *l = m + NH, *acc = l + NH, *w = acc + (size_t)NH * LR;
            for (int i = 0; i < copies; i++) {
                const uint16_t *ckv = (const uint16_t *)(const void *)(all + (size_t)i * per);
                kern->mla_range(ckv, ckv + L * LR, L * (size_t)t / (size_t)nt,
                                L * (size_t)(t + 1) / (size_t)nt, ql, qr, m, l, acc, w);
                cpu_barrier(&bar, nt);
            }
        }
        const double dt = (now_s() - t0) / copies;
        if (dt < best)
            best = dt;
    }
    if (c->json)
        printf("{\"mode\": \"mla\", \"backend\": \"cpu\", \"isa\": \"%s\", \"threads\": %d, "
               "\"context\": %zu, \"bytes\": %zu, \"copies\": %d, \"mla_us\": %.1f, "
               "\"read_us\": %.1f, \"membw_GBps\": %.2f}\n", kern->name, threads, L, L * row,
               copies, best * 1e6, (double)(L * row) / bw * 1e6, bw / 1e9);
    else
        printf("MLA attention, cpu (%s, %d threads), %zu tokens (%zu bytes of cache, cold, %d "
               "copies): %.1f us (%.1f ns a token); a read of the same bytes at %.1f GB/s: "
               "%.1f us\n", kern->name, threads, L, L * row, copies, best * 1e6,
               best * 1e9 / (double)L, bw / 1e9, (double)(L * row) / bw * 1e6);
    hd_free_aligned(all);
    hd_free_aligned(part);
    free(ql);
    free(qr);
    return 0;
}
#else
static int run_gemv(const bench_config *c)
{
    (void)c;
    fprintf(stderr, "hd-bench: --gemv needs the cpu backend, which this build lacks\n");
    return 1;
}

static int run_mla(const bench_config *c)
{
    (void)c;
    fprintf(stderr, "hd-bench: --mla needs the cpu backend, which this build lacks\n");
    return 1;
}
#endif

int main(int argc, char **argv)
{
    bench_config c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    return c.gemv ? run_gemv(&c) : c.mla ? run_mla(&c) : run_steps(&c);
}
