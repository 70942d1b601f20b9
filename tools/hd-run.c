/*
 * hd-run - run decode steps of a libhd model and report timings, a checksum
 * and (optionally) the agreement with the reference backend.
 *
 * Uses only the public API of include/hd.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "hd.h"

#define PROG "hd-run"

/* The agreement tolerance of docs/SEMANTICS.md for per-step outputs. */
#define CHECK_TOLERANCE 1e-2

#define EXIT_USAGE 2

/* Upper bound accepted for --threads. */
#define MAX_THREADS 4096

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */

typedef struct run_config {
    uint32_t seed;
    int experts;
    const char *pattern;
    int synth_given;
    int experts_given;
    int pattern_given;
    const char *model_path;
    size_t context;
    size_t steps;
    hd_backend backend;
    int threads;
    const char *dump_out;
    const char *dump_state;
    const char *save_model;
    int check;
    int quiet;
} run_config;

static void print_help(FILE *f)
{
    fprintf(f,
        "Usage: " PROG " [options]\n"
        "Run decode steps of a libhd model and report timings and a checksum.\n"
        "\n"
        "Model:\n"
        "  --synth SEED          synthetic model of SYNTH.md with this seed (default 1)\n"
        "  --experts E           routed experts of the synthetic model (%d..%d, default 16)\n"
        "  --pattern P           layer pattern of the synthetic model, 'K'/'M' letters\n"
        "                        (1..%d, default KKKM)\n"
        "  --model FILE          load FILE.safetensors instead (not with --synth,\n"
        "                        --experts or --pattern)\n"
        "  --save-model FILE     write the model to FILE (safetensors) and continue\n"
        "\n"
        "Run:\n"
        "  --context L0          prefill L0 rows of every MLA cache from SYNTH's\n"
        "                        state.c_kv/state.k_rope (default 0)\n"
        "  --steps N             decode steps; step T's input is SYNTH's input.T\n"
        "                        (default 8)\n"
        "  --backend B           auto, ref, cpu or cuda (default: the HD_BACKEND\n"
        "                        environment variable, else auto)\n"
        "  --threads N           CPU threads, 0 = OMP_NUM_THREADS or all cores\n"
        "                        (0..%d, default 0)\n"
        "\n"
        "The seed of the inputs and of the prefilled cache is the --synth value\n"
        "(1 with --model).\n"
        "\n"
        "Output:\n"
        "  --dump-out FILE       write all outputs, [steps, %d] bf16 little-endian\n"
        "  --dump-state DIR      after the last step write S.f32, conv.bf16,\n"
        "                        c_kv.bf16 and k_rope.bf16 into DIR (created if missing)\n"
        "  --check               also step the reference backend and print the\n"
        "                        relative L2 error of every output; fail if one\n"
        "                        exceeds %.0e or an output is not finite\n"
        "  -q, --quiet           print only the summary line\n"
        "  -h, --help            show this help and exit\n"
        "  -V, --version         show the version and exit\n"
        "\n"
        "The summary line reads\n"
        "  summary: backend=NAME steps=N median_us=X tokens_per_s=X checksum=HEX\n"
        "median_us is the median wall time of one hd_step call, tokens_per_s is\n"
        "steps divided by the total time spent in hd_step, and checksum is the\n"
        "64-bit FNV-1a hash of the little-endian bytes of all outputs.\n"
        "\n"
        "Exit status: 0 success, 1 error (or a failed --check), 2 bad usage.\n",
        HD_MIN_EXPERTS, HD_MAX_EXPERTS, HD_MAX_LAYERS, MAX_THREADS, HD_HIDDEN,
        CHECK_TOLERANCE);
}

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help' for more information.\n");
    return EXIT_USAGE;
}

/* Strict parse of an unsigned decimal number in [min, max].  Rejects empty
 * strings, signs, leading blanks and trailing characters. */
static int parse_unsigned(const char *s, unsigned long long min,
                          unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    unsigned long long v;

    if (s == NULL || s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int valid_pattern(const char *p)
{
    size_t n = strlen(p);

    if (n == 0 || n > HD_MAX_LAYERS)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] != 'K' && p[i] != 'M')
            return 0;
    return 1;
}

enum {
    OPT_SYNTH = 256,
    OPT_EXPERTS,
    OPT_PATTERN,
    OPT_MODEL,
    OPT_CONTEXT,
    OPT_STEPS,
    OPT_BACKEND,
    OPT_THREADS,
    OPT_DUMP_OUT,
    OPT_DUMP_STATE,
    OPT_SAVE_MODEL,
    OPT_CHECK
};

static const struct option long_options[] = {
    {"synth", required_argument, NULL, OPT_SYNTH},
    {"experts", required_argument, NULL, OPT_EXPERTS},
    {"pattern", required_argument, NULL, OPT_PATTERN},
    {"model", required_argument, NULL, OPT_MODEL},
    {"context", required_argument, NULL, OPT_CONTEXT},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"dump-out", required_argument, NULL, OPT_DUMP_OUT},
    {"dump-state", required_argument, NULL, OPT_DUMP_STATE},
    {"save-model", required_argument, NULL, OPT_SAVE_MODEL},
    {"check", no_argument, NULL, OPT_CHECK},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0}
};

/* Returns -1 to go on, else the exit status (0 after --help/--version). */
static int parse_args(int argc, char **argv, run_config *cfg)
{
    int c;
    unsigned long long v;

    memset(cfg, 0, sizeof *cfg);
    cfg->seed = 1;
    cfg->experts = 16;
    cfg->pattern = "KKKM";
    cfg->steps = 8;
    cfg->backend = HD_BACKEND_DEFAULT;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":qhV", long_options, NULL)) != -1) {
        switch (c) {
        case OPT_SYNTH:
            if (parse_unsigned(optarg, 0, UINT32_MAX, &v) != 0)
                return usage_error("--synth: invalid seed '%s' (0..4294967295)", optarg);
            cfg->seed = (uint32_t)v;
            cfg->synth_given = 1;
            break;
        case OPT_EXPERTS:
            if (parse_unsigned(optarg, HD_MIN_EXPERTS, HD_MAX_EXPERTS, &v) != 0)
                return usage_error("--experts: invalid expert count '%s' "
                                   "(8..65536)", optarg);
            cfg->experts = (int)v;
            cfg->experts_given = 1;
            break;
        case OPT_PATTERN:
            if (!valid_pattern(optarg))
                return usage_error("--pattern: invalid pattern '%s' (1 to 64 "
                                   "letters K or M)", optarg);
            cfg->pattern = optarg;
            cfg->pattern_given = 1;
            break;
        case OPT_MODEL:
            if (optarg[0] == '\0')
                return usage_error("--model: empty file name");
            cfg->model_path = optarg;
            break;
        case OPT_CONTEXT:
            if (parse_unsigned(optarg, 0, SIZE_MAX, &v) != 0)
                return usage_error("--context: invalid row count '%s'", optarg);
            cfg->context = (size_t)v;
            break;
        case OPT_STEPS:
            if (parse_unsigned(optarg, 0, SIZE_MAX, &v) != 0)
                return usage_error("--steps: invalid step count '%s'", optarg);
            cfg->steps = (size_t)v;
            break;
        case OPT_BACKEND:
            if (hd_backend_parse(optarg, &cfg->backend) != HD_OK)
                return usage_error("--backend: unknown backend '%s' "
                                   "(auto, ref, cpu or cuda)", optarg);
            break;
        case OPT_THREADS:
            if (parse_unsigned(optarg, 0, MAX_THREADS, &v) != 0)
                return usage_error("--threads: invalid thread count '%s' "
                                   "(0..4096)", optarg);
            cfg->threads = (int)v;
            break;
        case OPT_DUMP_OUT:
            if (optarg[0] == '\0')
                return usage_error("--dump-out: empty file name");
            cfg->dump_out = optarg;
            break;
        case OPT_DUMP_STATE:
            if (optarg[0] == '\0')
                return usage_error("--dump-state: empty directory name");
            cfg->dump_state = optarg;
            break;
        case OPT_SAVE_MODEL:
            if (optarg[0] == '\0')
                return usage_error("--save-model: empty file name");
            cfg->save_model = optarg;
            break;
        case OPT_CHECK:
            cfg->check = 1;
            break;
        case 'q':
            cfg->quiet = 1;
            break;
        case 'h':
            print_help(stdout);
            return fflush(stdout) == 0 ? 0 : 1;
        case 'V':
            printf(PROG " %s (libhd %s)\n", HD_VERSION_STRING,
                   hd_version_string());
            return fflush(stdout) == 0 ? 0 : 1;
        case ':':
            return usage_error("option '%s' needs an argument",
                               argv[optind - 1]);
        case '?':
        default:
            if (optopt > 0 && optopt < 128 && strchr("qhV", optopt) == NULL) {
                char opt[3] = {'-', (char)optopt, '\0'};
                return usage_error("unknown option '%s'", opt);
            }
            return usage_error("invalid option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (cfg->model_path != NULL &&
        (cfg->synth_given || cfg->experts_given || cfg->pattern_given))
        return usage_error("--model cannot be combined with --synth, "
                           "--experts or --pattern");
    if (cfg->steps > SIZE_MAX - cfg->context)
        return usage_error("--context + --steps overflows");
    return -1;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* Prints "hd-run: <what>: <err or the status string>" on stderr. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void report(hd_status st, const char *err, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s\n",
            (err != NULL && err[0] != '\0') ? err : hd_status_string(st));
}

static int mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return -1;
    *out = a * b;
    return 0;
}

static float bf16_to_float(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;

    memcpy(&f, &u, sizeof f);
    return f;
}

static int bf16_is_finite(uint16_t bits)
{
    return (bits & 0x7f80u) != 0x7f80u;
}

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define FNV64_BASIS UINT64_C(0xcbf29ce484222325)
#define FNV64_PRIME UINT64_C(0x100000001b3)

static uint64_t fnv1a64_bf16(uint64_t h, const uint16_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(v[i] & 0xffu)) * FNV64_PRIME;
        h = (h ^ (uint64_t)(v[i] >> 8)) * FNV64_PRIME;
    }
    return h;
}

/* Writes n 16-bit values as little-endian bytes. */
static int write_le16(FILE *f, const uint16_t *v, size_t n)
{
    unsigned char buf[8192];

    while (n > 0) {
        size_t chunk = n < sizeof buf / 2 ? n : sizeof buf / 2;
        for (size_t i = 0; i < chunk; i++) {
            buf[2 * i] = (unsigned char)(v[i] & 0xffu);
            buf[2 * i + 1] = (unsigned char)(v[i] >> 8);
        }
        if (fwrite(buf, 2, chunk, f) != chunk)
            return -1;
        v += chunk;
        n -= chunk;
    }
    return 0;
}

/* Writes n fp32 values as little-endian bytes. */
static int write_le_f32(FILE *f, const float *v, size_t n)
{
    unsigned char buf[8192];

    while (n > 0) {
        size_t chunk = n < sizeof buf / 4 ? n : sizeof buf / 4;
        for (size_t i = 0; i < chunk; i++) {
            uint32_t u;
            memcpy(&u, &v[i], sizeof u);
            buf[4 * i] = (unsigned char)(u & 0xffu);
            buf[4 * i + 1] = (unsigned char)((u >> 8) & 0xffu);
            buf[4 * i + 2] = (unsigned char)((u >> 16) & 0xffu);
            buf[4 * i + 3] = (unsigned char)(u >> 24);
        }
        if (fwrite(buf, 4, chunk, f) != chunk)
            return -1;
        v += chunk;
        n -= chunk;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static size_t count_mla(const char *pattern)
{
    size_t n = 0;

    for (; *pattern != '\0'; pattern++)
        if (*pattern == 'M')
            n++;
    return n;
}

/* Creates the model of the configuration on `backend`. */
static int make_model(const run_config *cfg, hd_backend backend,
                      const char *role, hd_model **model)
{
    hd_options opts;
    hd_status st;
    char err[512] = "";

    hd_options_init(&opts);
    opts.backend = backend;
    opts.threads = cfg->threads;
    if (cfg->model_path != NULL) {
        st = hd_model_load(cfg->model_path, &opts, model, err, sizeof err);
        if (st != HD_OK)
            report(st, err, "cannot load %smodel '%s'", role, cfg->model_path);
    } else {
        st = hd_model_synth(cfg->seed, cfg->experts, cfg->pattern, &opts,
                            model, err, sizeof err);
        if (st != HD_OK)
            report(st, err, "cannot create %ssynth model", role);
    }
    if (st != HD_OK) {
        *model = NULL;
        return -1;
    }
    return 0;
}

/* Creates a state with room for context + steps rows, prefilled from
 * SYNTH's state.c_kv / state.k_rope (the same rows for every MLA layer). */
static int make_state(const hd_model *model, const run_config *cfg,
                      hd_state **state)
{
    hd_status st;
    size_t n_mla = count_mla(hd_model_pattern(model));
    size_t kv_n, rope_n, kv_all, rope_all, bytes;
    uint16_t *c_kv = NULL, *k_rope = NULL;
    int rc = -1;

    st = hd_state_new(model, cfg->context + cfg->steps, state);
    if (st != HD_OK) {
        report(st, NULL, "cannot create the state");
        *state = NULL;
        return -1;
    }
    if (cfg->context == 0)
        return 0;

    if (mul_size(cfg->context, HD_MLA_KV_LORA, &kv_n) != 0 ||
        mul_size(cfg->context, HD_MLA_QK_ROPE, &rope_n) != 0 ||
        mul_size(kv_n, n_mla ? n_mla : 1, &kv_all) != 0 ||
        mul_size(rope_n, n_mla ? n_mla : 1, &rope_all) != 0 ||
        mul_size(kv_all, sizeof(uint16_t), &bytes) != 0) {
        report(HD_ERR_OUT_OF_MEMORY, NULL, "cannot prefill the context");
        goto done;
    }
    c_kv = malloc(kv_all * sizeof(uint16_t));
    k_rope = malloc(rope_all * sizeof(uint16_t));
    if (c_kv == NULL || k_rope == NULL) {
        report(HD_ERR_OUT_OF_MEMORY, NULL, "cannot prefill the context");
        goto done;
    }
    st = hd_synth_cache(cfg->seed, cfg->context, c_kv, k_rope);
    if (st != HD_OK) {
        report(st, NULL, "cannot make the synthetic cache");
        goto done;
    }
    for (size_t m = 1; m < n_mla; m++) {
        memcpy(c_kv + m * kv_n, c_kv, kv_n * sizeof(uint16_t));
        memcpy(k_rope + m * rope_n, k_rope, rope_n * sizeof(uint16_t));
    }
    st = hd_state_prefill(*state, cfg->context, c_kv, k_rope);
    if (st != HD_OK) {
        report(st, NULL, "cannot prefill the context");
        goto done;
    }
    rc = 0;
done:
    free(c_kv);
    free(k_rope);
    if (rc != 0) {
        hd_state_free(*state);
        *state = NULL;
    }
    return rc;
}

/* Appends state tensor `which` of `layer` to f, little-endian. */
static int dump_tensor(const hd_state *state, int layer, hd_state_tensor which,
                       FILE *f, const char *path)
{
    size_t bytes = 0;
    void *buf;
    hd_status st;
    int rc;

    st = hd_state_tensor_bytes(state, layer, which, &bytes);
    if (st != HD_OK) {
        report(st, NULL, "state tensor %d of layer %d", (int)which, layer);
        return -1;
    }
    if (bytes == 0)
        return 0;
    buf = malloc(bytes);
    if (buf == NULL) {
        report(HD_ERR_OUT_OF_MEMORY, NULL, "cannot dump the state");
        return -1;
    }
    st = hd_state_export(state, layer, which, buf, bytes);
    if (st != HD_OK) {
        report(st, NULL, "cannot export state tensor %d of layer %d",
               (int)which, layer);
        free(buf);
        return -1;
    }
    if (which == HD_STATE_S)
        rc = write_le_f32(f, buf, bytes / sizeof(float));
    else
        rc = write_le16(f, buf, bytes / sizeof(uint16_t));
    free(buf);
    if (rc != 0) {
        fprintf(stderr, PROG ": cannot write '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    return 0;
}

static int dump_state_file(const hd_state *state, const char *pattern,
                           const char *dir, const char *name, char kind,
                           const hd_state_tensor *which, int n_which)
{
    char path[4096];
    FILE *f;
    int rc = 0;

    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
        fprintf(stderr, PROG ": --dump-state: directory name too long\n");
        return -1;
    }
    f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, PROG ": cannot create '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    for (int layer = 0; pattern[layer] != '\0' && rc == 0; layer++) {
        if (pattern[layer] != kind)
            continue;
        for (int j = 0; j < n_which && rc == 0; j++)
            rc = dump_tensor(state, layer, which[j], f, path);
    }
    if (fclose(f) != 0 && rc == 0) {
        fprintf(stderr, PROG ": cannot write '%s': %s\n", path,
                strerror(errno));
        rc = -1;
    }
    return rc;
}

static int dump_state(const hd_state *state, const hd_model *model,
                      const char *dir)
{
    static const hd_state_tensor s_t[] = {HD_STATE_S};
    static const hd_state_tensor conv_t[] = {HD_STATE_CONV_Q, HD_STATE_CONV_K,
                                             HD_STATE_CONV_V};
    static const hd_state_tensor ckv_t[] = {HD_STATE_C_KV};
    static const hd_state_tensor rope_t[] = {HD_STATE_K_ROPE};
    const char *pattern = hd_model_pattern(model);
    struct stat sb;

    if (mkdir(dir, 0777) != 0) {
        int e = errno;
        if (e != EEXIST || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, PROG ": cannot create directory '%s': %s\n", dir,
                    strerror(e == EEXIST ? ENOTDIR : e));
            return -1;
        }
    }
    if (dump_state_file(state, pattern, dir, "S.f32", 'K', s_t, 1) != 0 ||
        dump_state_file(state, pattern, dir, "conv.bf16", 'K', conv_t, 3) != 0 ||
        dump_state_file(state, pattern, dir, "c_kv.bf16", 'M', ckv_t, 1) != 0 ||
        dump_state_file(state, pattern, dir, "k_rope.bf16", 'M', rope_t, 1) != 0)
        return -1;
    return 0;
}

/* Relative L2 error |a - b| / |b| of two bf16 vectors. */
static double rel_error(const uint16_t *a, const uint16_t *b, size_t n)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < n; i++) {
        double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num) / sqrt(den);
}

static size_t count_nonfinite(const uint16_t *v, size_t n)
{
    size_t c = 0;

    for (size_t i = 0; i < n; i++)
        if (!bf16_is_finite(v[i]))
            c++;
    return c;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    run_config cfg;
    hd_model *model = NULL, *ref_model = NULL;
    hd_state *state = NULL, *ref_state = NULL;
    double *times = NULL;
    FILE *out_file = NULL;
    uint16_t in[HD_HIDDEN], out[HD_HIDDEN], ref_out[HD_HIDDEN];
    uint64_t checksum = FNV64_BASIS;
    double total_us = 0.0, median_us = 0.0, tokens_per_s = 0.0;
    double max_err = 0.0;
    int check_failed = 0;
    int saw_nonfinite = 0;
    int status = 1;
    int rc;
    hd_status st;
    size_t times_bytes;

    rc = parse_args(argc, argv, &cfg);
    if (rc >= 0)
        return rc;

    if (mul_size(cfg.steps, sizeof(double), &times_bytes) != 0) {
        report(HD_ERR_OUT_OF_MEMORY, NULL, "--steps %zu: too many steps",
               cfg.steps);
        return 1;
    }

    if (make_model(&cfg, cfg.backend, "", &model) != 0)
        goto done;

    if (cfg.save_model != NULL) {
        char err[512] = "";
        st = hd_model_save(model, cfg.save_model, err, sizeof err);
        if (st != HD_OK) {
            report(st, err, "cannot save the model to '%s'", cfg.save_model);
            goto done;
        }
    }

    if (!cfg.quiet) {
        printf(PROG " %s (libhd %s)\n", HD_VERSION_STRING, hd_version_string());
        if (cfg.model_path != NULL)
            printf("model: %s\n", cfg.model_path);
        else
            printf("model: synth seed=%lu experts=%d pattern=%s\n",
                   (unsigned long)cfg.seed, cfg.experts, cfg.pattern);
        printf("layers: %d (%s)  experts: %d  weights: %.1f MB\n",
               hd_model_layers(model), hd_model_pattern(model),
               hd_model_experts(model),
               (double)hd_model_weight_bytes(model) / 1e6);
        printf("backend: %s\n", hd_model_backend_info(model));
        printf("context: %zu  steps: %zu  input seed: %lu\n", cfg.context,
               cfg.steps, (unsigned long)cfg.seed);
        if (cfg.save_model != NULL)
            printf("saved: %s\n", cfg.save_model);
        fflush(stdout);
    }

    if (cfg.check &&
        make_model(&cfg, HD_BACKEND_REF, "reference ", &ref_model) != 0)
        goto done;

    if (make_state(model, &cfg, &state) != 0)
        goto done;
    if (ref_model != NULL && make_state(ref_model, &cfg, &ref_state) != 0)
        goto done;

    times = malloc(times_bytes ? times_bytes : 1);
    if (times == NULL) {
        report(HD_ERR_OUT_OF_MEMORY, NULL, "cannot allocate the timing table");
        goto done;
    }

    if (cfg.dump_out != NULL) {
        out_file = fopen(cfg.dump_out, "wb");
        if (out_file == NULL) {
            fprintf(stderr, PROG ": cannot create '%s': %s\n", cfg.dump_out,
                    strerror(errno));
            goto done;
        }
    }

    for (size_t t = 0; t < cfg.steps; t++) {
        double t0, t1, err = 0.0;
        size_t bad;

        st = hd_synth_input(cfg.seed, (uint64_t)t, in);
        if (st != HD_OK) {
            report(st, NULL, "input of step %zu", t);
            goto done;
        }
        t0 = now_us();
        st = hd_step(model, state, in, out);
        t1 = now_us();
        if (st != HD_OK) {
            report(st, NULL, "step %zu", t);
            goto done;
        }
        times[t] = t1 - t0;
        total_us += times[t];
        checksum = fnv1a64_bf16(checksum, out, HD_HIDDEN);
        if (out_file != NULL && write_le16(out_file, out, HD_HIDDEN) != 0) {
            fprintf(stderr, PROG ": cannot write '%s': %s\n", cfg.dump_out,
                    strerror(errno));
            goto done;
        }
        bad = count_nonfinite(out, HD_HIDDEN);
        if (bad != 0) {
            fprintf(stderr, PROG ": warning: step %zu: %zu output values are "
                    "not finite\n", t, bad);
            if (cfg.check) {
                check_failed = 1;
                saw_nonfinite = 1;
            }
        }
        if (ref_model != NULL) {
            st = hd_step(ref_model, ref_state, in, ref_out);
            if (st != HD_OK) {
                report(st, NULL, "reference step %zu", t);
                goto done;
            }
            if (count_nonfinite(ref_out, HD_HIDDEN) != 0)
                fprintf(stderr, PROG ": warning: step %zu: reference output "
                        "values are not finite\n", t);
            err = rel_error(out, ref_out, HD_HIDDEN);
            if (!(err <= CHECK_TOLERANCE))
                check_failed = 1;
            if (!(err <= max_err))
                max_err = err; /* also takes NaN */
        }
        if (!cfg.quiet) {
            if (ref_model != NULL)
                printf("step %zu: %.1f us  rel_err=%.3e\n", t, times[t], err);
            else
                printf("step %zu: %.1f us\n", t, times[t]);
            fflush(stdout);
        }
    }

    if (out_file != NULL) {
        FILE *f = out_file;
        out_file = NULL;
        if (fclose(f) != 0) {
            fprintf(stderr, PROG ": cannot write '%s': %s\n", cfg.dump_out,
                    strerror(errno));
            goto done;
        }
    }

    if (cfg.dump_state != NULL && dump_state(state, model, cfg.dump_state) != 0)
        goto done;

    if (cfg.steps > 0) {
        qsort(times, cfg.steps, sizeof *times, cmp_double);
        if (cfg.steps % 2 == 1)
            median_us = times[cfg.steps / 2];
        else
            median_us = (times[cfg.steps / 2 - 1] + times[cfg.steps / 2]) / 2.0;
        if (total_us > 0.0)
            tokens_per_s = (double)cfg.steps * 1e6 / total_us;
    }

    if (cfg.check && !cfg.quiet)
        printf("check: max_rel_err=%.3e tolerance=%.1e %s\n", max_err,
               CHECK_TOLERANCE, check_failed ? "FAIL" : "ok");
    printf("summary: backend=%s steps=%zu median_us=%.1f tokens_per_s=%.1f "
           "checksum=%016llx\n",
           hd_backend_name(hd_model_backend(model)), cfg.steps, median_us,
           tokens_per_s, (unsigned long long)checksum);
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": cannot write to standard output: %s\n",
                strerror(errno));
        goto done;
    }
    if (check_failed) {
        if (saw_nonfinite)
            fprintf(stderr, PROG ": check failed: non-finite output values\n");
        if (!(max_err <= CHECK_TOLERANCE))
            fprintf(stderr, PROG ": check failed: max relative error %.3e "
                    "exceeds the tolerance %.1e\n", max_err, CHECK_TOLERANCE);
        goto done;
    }
    status = 0;

done:
    if (out_file != NULL)
        fclose(out_file);
    free(times);
    hd_state_free(ref_state);
    hd_state_free(state);
    hd_model_free(ref_model);
    hd_model_free(model);
    return status;
}
