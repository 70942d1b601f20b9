/* testutil.c - helpers shared by the Check suites of libhd. */
#include "config.h"

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h>
#endif

/* The process that ran tu_run_suite: temporary names carry its pid so that
 * the runner can sweep them up after forked tests that died half-way. */
static long tu_owner_pid;

static long owner_pid(void)
{
    if (tu_owner_pid == 0)
        tu_owner_pid = (long)getpid();
    return tu_owner_pid;
}

/* ---- memory -------------------------------------------------------------- */

void *tu_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_msg(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *tu_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    ck_assert_msg(p != NULL, "out of memory allocating %zu x %zu bytes",
                  count, size);
    return p;
}

/* ---- files ----------------------------------------------------------------- */

void *tu_read_file(const char *path, size_t *bytes)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open '%s': %s", path, strerror(errno));
    ck_assert_msg(fseek(f, 0, SEEK_END) == 0, "cannot seek '%s'", path);
    long len = ftell(f);
    ck_assert_msg(len >= 0, "cannot size '%s'", path);
    ck_assert_msg(fseek(f, 0, SEEK_SET) == 0, "cannot seek '%s'", path);
    unsigned char *buf = tu_xmalloc((size_t)len);
    size_t got = fread(buf, 1, (size_t)len, f);
    int bad = ferror(f);
    fclose(f);
    ck_assert_msg(!bad && got == (size_t)len,
                  "short read on '%s' (%zu of %ld bytes)", path, got, len);
    if (bytes)
        *bytes = (size_t)len;
    return buf;
}

void tu_write_file(const char *path, const void *data, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create '%s': %s", path, strerror(errno));
    size_t put = bytes ? fwrite(data, 1, bytes, f) : 0;
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    ck_assert_msg(!bad && put == bytes, "cannot write '%s'", path);
}

void *tu_load_data(const char *relpath, size_t *bytes)
{
    const char *root = getenv("HD_TEST_DATA");
    ck_assert_msg(root != NULL && root[0] != '\0',
                  "HD_TEST_DATA is not set: run the tests through 'make check' "
                  "or set it to the tests/data folder of the source tree");
    size_t n = strlen(root) + strlen(relpath) + 2;
    char *path = tu_xmalloc(n);
    snprintf(path, n, "%s/%s", root, relpath);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        /* Keep the message in a local buffer: path is freed before abort. */
        char msg[1024];
        snprintf(msg, sizeof msg, "test data file missing: '%s' (%s)", path,
                 strerror(errno));
        free(path);
        ck_abort_msg("%s", msg);
    }
    void *buf = tu_read_file(path, bytes);
    free(path);
    return buf;
}

void *tu_load_data_sized(const char *relpath, size_t expect_bytes)
{
    size_t got = 0;
    void *buf = tu_load_data(relpath, &got);
    if (got != expect_bytes) {
        free(buf);
        ck_abort_msg("test data file '%s' has %zu bytes, expected %zu",
                     relpath, got, expect_bytes);
    }
    return buf;
}

static bool host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

void tu_le16_to_host(uint16_t *p, size_t n)
{
    if (host_is_little_endian())
        return;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint16_t)((p[i] >> 8) | (p[i] << 8));
}

void tu_le32_to_host(uint32_t *p, size_t n)
{
    if (host_is_little_endian())
        return;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = p[i];
        p[i] = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) |
               (v << 24);
    }
}

/* ---- numbers -------------------------------------------------------------- */

float tu_bf16_to_f32(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double rel_from_sums(double diff2, double ref2)
{
    if (ref2 == 0.0)
        return sqrt(diff2); /* |b| == 0: |a - 0| = |a| */
    return sqrt(diff2) / sqrt(ref2);
}

double tu_rel_l2_f32(const float *a, const float *b, size_t n)
{
    double d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        d2 += d * d;
        r2 += (double)b[i] * (double)b[i];
    }
    return rel_from_sums(d2, r2);
}

double tu_rel_l2_bf16(const uint16_t *a, const uint16_t *b, size_t n)
{
    double d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = tu_bf16_to_f32(a[i]), y = tu_bf16_to_f32(b[i]);
        d2 += (x - y) * (x - y);
        r2 += y * y;
    }
    return rel_from_sums(d2, r2);
}

bool tu_all_finite_f32(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return false;
    return true;
}

bool tu_all_finite_bf16(const uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((p[i] & 0x7f80u) == 0x7f80u)
            return false;
    return true;
}

/* ---- temporary files ------------------------------------------------------ */

static char *temp_template(const char *tag)
{
    size_t n = strlen(tag) + 64;
    char *path = tu_xmalloc(n);
    snprintf(path, n, "hdtest-%ld-%s-XXXXXX", owner_pid(), tag);
    return path;
}

char *tu_temp_path(const char *tag)
{
    char *path = temp_template(tag);
    int fd = mkstemp(path);
    ck_assert_msg(fd >= 0, "mkstemp in the current directory failed: %s",
                  strerror(errno));
    close(fd);
    return path;
}

char *tu_temp_dir(const char *tag)
{
    char *path = temp_template(tag);
    ck_assert_msg(mkdtemp(path) != NULL,
                  "mkdtemp in the current directory failed: %s",
                  strerror(errno));
    return path;
}

void tu_remove(char *path)
{
    if (path == NULL)
        return;
    unlink(path);
    free(path);
}

void tu_remove_dir(char *path)
{
    if (path == NULL)
        return;
    rmdir(path);
    free(path);
}

/* Removes every "hdtest-<owner pid>-*" entry of the current directory. */
static void sweep_temp_files(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "hdtest-%ld-", owner_pid());
    size_t plen = strlen(prefix);
    DIR *d = opendir(".");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        if (unlink(e->d_name) != 0)
            rmdir(e->d_name);
    }
    closedir(d);
}

/* ---- models, states, steps ------------------------------------------------ */

void tu_options_ref(hd_options *options)
{
    hd_options_init(options);
    options->backend = HD_BACKEND_REF;
}

hd_model *tu_synth_ref(uint32_t seed, int experts, const char *pattern)
{
    hd_options opt;
    tu_options_ref(&opt);
    hd_model *model = NULL;
    char err[512] = "";
    hd_status st =
        hd_model_synth(seed, experts, pattern, &opt, &model, err, sizeof err);
    ck_assert_msg(st == HD_OK,
                  "hd_model_synth(seed %u, E %d, '%s') = %d (%s): %s",
                  (unsigned)seed, experts, pattern ? pattern : "(null)",
                  (int)st, hd_status_string(st), err);
    ck_assert_msg(model != NULL, "hd_model_synth returned HD_OK and NULL");
    ck_assert_int_eq(hd_model_backend(model), HD_BACKEND_REF);
    return model;
}

hd_state *tu_state_new(const hd_model *model, size_t capacity)
{
    hd_state *state = NULL;
    hd_status st = hd_state_new(model, capacity, &state);
    ck_assert_msg(st == HD_OK, "hd_state_new(capacity %zu) = %d (%s)",
                  capacity, (int)st, hd_status_string(st));
    ck_assert_msg(state != NULL, "hd_state_new returned HD_OK and NULL");
    return state;
}

void tu_input(uint32_t seed, uint64_t step, uint16_t *out_bf16)
{
    hd_status st = hd_synth_input(seed, step, out_bf16);
    ck_assert_msg(st == HD_OK, "hd_synth_input(%u, %llu) = %d (%s)",
                  (unsigned)seed, (unsigned long long)step, (int)st,
                  hd_status_string(st));
}

void tu_step(const hd_model *model, hd_state *state, const uint16_t *in,
             uint16_t *out)
{
    size_t ctx = hd_state_context(state);
    hd_status st = hd_step(model, state, in, out);
    ck_assert_msg(st == HD_OK, "hd_step at context %zu = %d (%s)", ctx,
                  (int)st, hd_status_string(st));
    ck_assert_msg(hd_state_context(state) == ctx + 1,
                  "hd_step: context %zu -> %zu, expected %zu", ctx,
                  hd_state_context(state), ctx + 1);
}

int tu_n_mla(const hd_model *model)
{
    int n = 0;
    for (const char *p = hd_model_pattern(model); *p; p++)
        n += *p == 'M';
    return n;
}

/* ---- state snapshots ------------------------------------------------------ */

bool tu_layer_has(char kind, hd_state_tensor which)
{
    if (kind == 'K')
        return which == HD_STATE_S || which == HD_STATE_CONV_Q ||
               which == HD_STATE_CONV_K || which == HD_STATE_CONV_V;
    if (kind == 'M')
        return which == HD_STATE_C_KV || which == HD_STATE_K_ROPE;
    return false;
}

/* The documented size of a tensor at a given context. */
static size_t expected_bytes(hd_state_tensor which, size_t context)
{
    switch (which) {
    case HD_STATE_S:
        return (size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM * 4;
    case HD_STATE_CONV_Q:
    case HD_STATE_CONV_K:
    case HD_STATE_CONV_V:
        return (size_t)(HD_KDA_CONV - 1) * HD_KDA_HEADS * HD_KDA_HEAD_DIM * 2;
    case HD_STATE_C_KV:
        return context * HD_MLA_KV_LORA * 2;
    case HD_STATE_K_ROPE:
        return context * HD_MLA_QK_ROPE * 2;
    }
    return 0;
}

tu_snapshot *tu_snapshot_take(const hd_model *model, const hd_state *state)
{
    tu_snapshot *s = tu_xcalloc(1, sizeof *s);
    const char *pattern = hd_model_pattern(model);
    s->n_layers = hd_model_layers(model);
    ck_assert_int_eq((int)strlen(pattern), s->n_layers);
    ck_assert_int_le(s->n_layers, HD_MAX_LAYERS);
    memcpy(s->pattern, pattern, (size_t)s->n_layers + 1);
    s->context = hd_state_context(state);
    for (int l = 0; l < s->n_layers; l++) {
        for (int w = 0; w < TU_N_STATE_TENSORS; w++) {
            if (!tu_layer_has(pattern[l], (hd_state_tensor)w))
                continue;
            size_t bytes = 0;
            hd_status st = hd_state_tensor_bytes(state, l, (hd_state_tensor)w,
                                                 &bytes);
            ck_assert_msg(st == HD_OK,
                          "hd_state_tensor_bytes(layer %d, tensor %d) = %d",
                          l, w, (int)st);
            ck_assert_msg(bytes == expected_bytes((hd_state_tensor)w,
                                                  s->context),
                          "layer %d tensor %d: %zu bytes, expected %zu", l, w,
                          bytes,
                          expected_bytes((hd_state_tensor)w, s->context));
            s->bytes[l][w] = bytes;
            s->data[l][w] = tu_xmalloc(bytes);
            st = hd_state_export(state, l, (hd_state_tensor)w, s->data[l][w],
                                 bytes);
            ck_assert_msg(st == HD_OK,
                          "hd_state_export(layer %d, tensor %d, %zu bytes) = "
                          "%d (%s)",
                          l, w, bytes, (int)st, hd_status_string(st));
        }
    }
    return s;
}

bool tu_snapshot_equal(const tu_snapshot *a, const tu_snapshot *b)
{
    if (a->n_layers != b->n_layers || a->context != b->context ||
        strcmp(a->pattern, b->pattern) != 0)
        return false;
    for (int l = 0; l < a->n_layers; l++)
        for (int w = 0; w < TU_N_STATE_TENSORS; w++) {
            if (a->bytes[l][w] != b->bytes[l][w])
                return false;
            if ((a->data[l][w] == NULL) != (b->data[l][w] == NULL))
                return false;
            if (a->bytes[l][w] &&
                memcmp(a->data[l][w], b->data[l][w], a->bytes[l][w]) != 0)
                return false;
        }
    return true;
}

void tu_snapshot_restore(hd_state *state, const tu_snapshot *snap)
{
    size_t rows = snap->context;
    int n_mla = 0;
    for (int l = 0; l < snap->n_layers; l++)
        n_mla += snap->pattern[l] == 'M';

    uint16_t *c_kv = NULL, *k_rope = NULL;
    if (n_mla > 0 && rows > 0) {
        size_t ckv_row = (size_t)HD_MLA_KV_LORA, kr_row = HD_MLA_QK_ROPE;
        c_kv = tu_xmalloc((size_t)n_mla * rows * ckv_row * 2);
        k_rope = tu_xmalloc((size_t)n_mla * rows * kr_row * 2);
        int m = 0;
        for (int l = 0; l < snap->n_layers; l++) {
            if (snap->pattern[l] != 'M')
                continue;
            memcpy(c_kv + (size_t)m * rows * ckv_row,
                   snap->data[l][HD_STATE_C_KV], rows * ckv_row * 2);
            memcpy(k_rope + (size_t)m * rows * kr_row,
                   snap->data[l][HD_STATE_K_ROPE], rows * kr_row * 2);
            m++;
        }
    }
    hd_status st = hd_state_prefill(state, rows, c_kv, k_rope);
    free(c_kv);
    free(k_rope);
    ck_assert_msg(st == HD_OK, "hd_state_prefill(%zu rows) = %d (%s)", rows,
                  (int)st, hd_status_string(st));
    ck_assert_uint_eq(hd_state_context(state), rows);

    for (int l = 0; l < snap->n_layers; l++)
        for (int w = 0; w < TU_N_STATE_TENSORS; w++) {
            if (snap->data[l][w] == NULL)
                continue;
            st = hd_state_import(state, l, (hd_state_tensor)w,
                                 snap->data[l][w], snap->bytes[l][w]);
            ck_assert_msg(st == HD_OK,
                          "hd_state_import(layer %d, tensor %d, %zu bytes) = "
                          "%d (%s)",
                          l, w, snap->bytes[l][w], (int)st,
                          hd_status_string(st));
        }
}

void tu_snapshot_free(tu_snapshot *snap)
{
    if (snap == NULL)
        return;
    for (int l = 0; l < HD_MAX_LAYERS; l++)
        for (int w = 0; w < TU_N_STATE_TENSORS; w++)
            free(snap->data[l][w]);
    free(snap);
}

/* ---- test size ---------------------------------------------------------------- */

bool tu_under_valgrind(void)
{
#ifdef HAVE_VALGRIND_VALGRIND_H
    return RUNNING_ON_VALGRIND ? true : false;
#else
    return false;
#endif
}

/* 1 small, 0 full, -1 HD_TEST_SCALE holds something else. */
static int scale_from_env(void)
{
    const char *v = getenv("HD_TEST_SCALE");
    if (v == NULL || v[0] == '\0')
        return tu_under_valgrind() ? 1 : 0;
    if (strcmp(v, "small") == 0)
        return 1;
    if (strcmp(v, "full") == 0)
        return 0;
    return -1;
}

bool tu_small(void)
{
    int s = scale_from_env();
    ck_assert_msg(s >= 0, "HD_TEST_SCALE='%s' is neither small nor full",
                  getenv("HD_TEST_SCALE"));
    return s == 1;
}

int tu_size(int full, int small)
{
    return tu_small() ? small : full;
}

/* ---- running ---------------------------------------------------------------- */

int tu_run_suite(Suite *suite)
{
    (void)owner_pid(); /* fix the temp-name prefix before any fork */
    SRunner *sr = srunner_create(suite);
    int scale = scale_from_env();
    if (scale < 0) {
        fprintf(stderr, "HD_TEST_SCALE='%s' is neither small nor full\n",
                getenv("HD_TEST_SCALE"));
        srunner_free(sr);
        return EXIT_FAILURE;
    }
    printf("test size: %s\n", scale ? "small" : "full");
    fflush(stdout);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    sweep_temp_files();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
