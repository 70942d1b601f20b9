/* bench_cuda.c - times hd_step on a backend (default cuda) at one context:
 * median and best wall time of N steps (hd_step synchronizes), the bytes a
 * step must move (hd_model_step_bytes) and the fraction of the backend's
 * measured copy bandwidth that is.  Not a test: built by `make check`, run
 * by scripts/device-run.sh.
 * Usage: bench_cuda [E] [steps] [backend] [context...] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hd.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_context(hd_model *m, int E, size_t ctx, int steps, double bw)
{
    hd_state *s = NULL;
    uint16_t in[HD_HIDDEN], out[HD_HIDDEN];
    hd_status st;

    if (hd_state_new(m, ctx + (size_t)steps + 4, &s) != HD_OK)
        return 1;
    if (ctx) {
        uint16_t *ckv = malloc(ctx * 512 * 2), *kr = malloc(ctx * 64 * 2);
        if (!ckv || !kr || hd_synth_cache(1, ctx, ckv, kr) != HD_OK ||
            hd_state_prefill(s, ctx, ckv, kr) != HD_OK)
            return 1;
        free(ckv);
        free(kr);
    }
    double *t = calloc((size_t)steps, sizeof *t);
    hd_synth_input(1, 0, in);
    if (!t || hd_step(m, s, in, out) != HD_OK) /* warm-up */
        return 1;
    for (int i = 0; i < steps; i++) {
        hd_synth_input(1, (uint64_t)i + 1, in);
        double t0 = now_us();
        st = hd_step(m, s, in, out);
        t[i] = now_us() - t0;
        if (st != HD_OK) {
            printf("bench: step %d: %s\n", i, hd_status_string(st));
            return 1;
        }
    }
    qsort(t, (size_t)steps, sizeof *t, cmp);
    double med = t[steps / 2];
    uint64_t bytes = hd_model_step_bytes(m, ctx + 1 + (size_t)steps / 2);
    printf("bench backend=%s E=%d context=%zu steps=%d median_us=%.1f min_us=%.1f "
           "step_MB=%.1f GBps=%.0f copy_bw_GBps=%.0f fraction=%.3f\n",
           hd_backend_name(hd_model_backend(m)), E, ctx, steps, med, t[0],
           (double)bytes / 1e6, (double)bytes / med * 1e-3, bw * 1e-9,
           bw > 0 ? (double)bytes / (med * 1e-6) / bw : 0.0);
    fflush(stdout);
    /* One more step with the CUDA module's phase times (stderr). */
    setenv("HD_CUDA_PHASES", "1", 1);
    hd_synth_input(1, (uint64_t)steps + 1, in);
    st = hd_step(m, s, in, out);
    unsetenv("HD_CUDA_PHASES");
    free(t);
    hd_state_free(s);
    return st == HD_OK ? 0 : 1;
}

/* Usage: bench_cuda [E] [steps] [backend] [context...] */
int main(int argc, char **argv)
{
    int E = argc > 1 ? atoi(argv[1]) : 256;
    int steps = argc > 2 ? atoi(argv[2]) : 40;
    hd_options opt;
    hd_model *m = NULL;
    char err[512] = "";
    hd_status st;
    double bw = 0.0;
    int rc = 0;

    hd_options_init(&opt);
    opt.backend = HD_BACKEND_CUDA;
    if (argc > 3 && hd_backend_parse(argv[3], &opt.backend) != HD_OK)
        return 2;
    if (steps < 1)
        steps = 1;
    st = hd_model_synth(1, E, "KKKM", &opt, &m, err, sizeof err);
    if (st != HD_OK) {
        printf("bench: %s: %s\n", hd_status_string(st), err);
        return st == HD_ERR_BACKEND_UNAVAILABLE ? 77 : 1;
    }
    printf("info: %s\n", hd_model_backend_info(m));
    hd_model_measure_bandwidth(m, &bw);
    if (argc <= 4)
        rc = bench_context(m, E, 0, steps, bw);
    for (int i = 4; i < argc && rc == 0; i++)
        rc = bench_context(m, E, (size_t)strtoull(argv[i], NULL, 10), steps, bw);
    hd_model_free(m);
    return rc;
}
