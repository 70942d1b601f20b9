/* test_api.c - the public API's contracts: status strings, versions, backend
 * names and choice, NULL and out-of-range arguments, size checks, state
 * ownership, non-finite input, in-place stepping.  Every failing call must
 * return the documented status and leave the objects as they were. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define D HD_HIDDEN
#define S_BYTES ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM * 4)
#define CONV_BYTES ((size_t)(HD_KDA_CONV - 1) * 4096 * 2)

#define ST_EQ(call, want)                                                      \
    do {                                                                       \
        hd_status st_ = (call);                                                \
        ck_assert_msg(st_ == (want), "%s = %d (%s), expected %s (%d)", #call,  \
                      (int)st_, hd_status_string(st_), #want, (int)(want));    \
    } while (0)

/* ---- status strings, versions ------------------------------------------ */

START_TEST(test_status_strings)
{
    enum { N = HD_ERR_INTERNAL + 1 };
    const char *s[N];
    for (int i = 0; i < N; i++) {
        s[i] = hd_status_string((hd_status)i);
        ck_assert_msg(s[i] != NULL, "hd_status_string(%d) is NULL", i);
        ck_assert_msg(s[i][0] != '\0', "hd_status_string(%d) is empty", i);
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            ck_assert_msg(strcmp(s[i], s[j]) != 0,
                          "statuses %d and %d have the same string '%s'", i, j,
                          s[i]);
    ck_assert_ptr_ne(hd_status_string((hd_status)999), NULL);
    ck_assert_ptr_ne(hd_status_string((hd_status)-1), NULL);
    ck_assert_ptr_ne(hd_status_string((hd_status)N), NULL);
    /* Pinned numbers. */
    ck_assert_int_eq(HD_OK, 0);
    ck_assert_int_eq(HD_ERR_NONFINITE, 10);
    ck_assert_int_eq(HD_ERR_INTERNAL, 12);
}
END_TEST

START_TEST(test_version)
{
    ck_assert_ptr_ne(hd_version_string(), NULL);
    ck_assert_str_eq(hd_version_string(), HD_VERSION_STRING);
    ck_assert_int_eq(hd_version_number(), HD_VERSION_NUMBER);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", HD_VERSION_MAJOR, HD_VERSION_MINOR,
             HD_VERSION_PATCH);
    ck_assert_str_eq(buf, HD_VERSION_STRING);
    ck_assert_int_eq(HD_VERSION_NUMBER, HD_VERSION_MAJOR * 10000 +
                                            HD_VERSION_MINOR * 100 +
                                            HD_VERSION_PATCH);
}
END_TEST

/* ---- backends ------------------------------------------------------------ */

START_TEST(test_backend_names)
{
    static const struct {
        const char *name;
        hd_backend b;
    } good[] = {{"ref", HD_BACKEND_REF},
                {"auto", HD_BACKEND_AUTO},
                {"cpu", HD_BACKEND_CPU},
                {"cuda", HD_BACKEND_CUDA}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        hd_backend b = HD_BACKEND_DEFAULT;
        ck_assert_msg(hd_backend_parse(good[i].name, &b) == HD_OK,
                      "hd_backend_parse(\"%s\") failed", good[i].name);
        ck_assert_int_eq(b, good[i].b);
        ck_assert_str_eq(hd_backend_name(good[i].b), good[i].name);
    }
    ck_assert_str_eq(hd_backend_name(HD_BACKEND_DEFAULT), "default");

    static const char *const bad[] = {"REF", "", "gpu", "Auto", "ref ",
                                      " ref", "cpu\n", "default", "re"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hd_backend b = HD_BACKEND_REF;
        hd_status st = hd_backend_parse(bad[i], &b);
        ck_assert_msg(st == HD_ERR_INVALID_ARGUMENT,
                      "hd_backend_parse(\"%s\") = %d, expected "
                      "HD_ERR_INVALID_ARGUMENT", bad[i], (int)st);
    }
    hd_backend b = HD_BACKEND_REF;
    ST_EQ(hd_backend_parse(NULL, &b), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_backend_parse("ref", NULL), HD_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_backend_available)
{
    char err[256] = "";
    ST_EQ(hd_backend_available(HD_BACKEND_REF, err, sizeof err), HD_OK);
    ST_EQ(hd_backend_available(HD_BACKEND_REF, NULL, 0), HD_OK);
    /* auto always finds something: the reference at least. */
    ST_EQ(hd_backend_available(HD_BACKEND_AUTO, NULL, 0), HD_OK);
    const hd_backend others[] = {HD_BACKEND_CPU, HD_BACKEND_CUDA};
    for (size_t i = 0; i < 2; i++) {
        err[0] = '\0';
        hd_status st = hd_backend_available(others[i], err, sizeof err);
        ck_assert_msg(st == HD_OK || st == HD_ERR_BACKEND_UNAVAILABLE,
                      "hd_backend_available(%s) = %d",
                      hd_backend_name(others[i]), (int)st);
        if (st != HD_OK)
            ck_assert_msg(err[0] != '\0',
                          "hd_backend_available(%s): no reason given",
                          hd_backend_name(others[i]));
        printf("backend %s: %s%s%s\n", hd_backend_name(others[i]),
               st == HD_OK ? "available" : "unavailable",
               st == HD_OK ? "" : ": ", st == HD_OK ? "" : err);
    }
    fflush(stdout);
}
END_TEST

/* A backend asked for by name that is not usable: an error, never a silent
 * fallback. */
START_TEST(test_backend_unavailable)
{
    const hd_backend others[] = {HD_BACKEND_CPU, HD_BACKEND_CUDA};
    int tried = 0;
    for (size_t i = 0; i < 2; i++) {
        if (hd_backend_available(others[i], NULL, 0) == HD_OK)
            continue;
        tried++;
        hd_options opt;
        hd_options_init(&opt);
        opt.backend = others[i];
        hd_model *m = (hd_model *)&opt; /* must be set to NULL */
        char err[256] = "";
        hd_status st = hd_model_synth(1, 8, "M", &opt, &m, err, sizeof err);
        ck_assert_msg(st == HD_ERR_BACKEND_UNAVAILABLE,
                      "hd_model_synth on unavailable backend %s = %d (%s)",
                      hd_backend_name(others[i]), (int)st,
                      hd_status_string(st));
        ck_assert_ptr_eq(m, NULL);
        ck_assert_msg(err[0] != '\0', "no message for an unavailable backend");
    }
    if (tried == 0)
        printf("every backend is available here: nothing to check\n");
}
END_TEST

START_TEST(test_options_init)
{
    hd_options opt;
    memset(&opt, 0x5a, sizeof opt);
    hd_options_init(&opt);
    ck_assert_uint_eq(opt.struct_size, sizeof(hd_options));
    ck_assert_int_eq(opt.backend, HD_BACKEND_DEFAULT);
    ck_assert_int_eq(opt.threads, 0);
    ck_assert_int_eq(opt.device, 0);

    /* An unknown backend value is an invalid argument. */
    opt.backend = (hd_backend)99;
    hd_model *m = (hd_model *)&opt;
    ST_EQ(hd_model_synth(1, 8, "M", &opt, &m, NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
}
END_TEST

/* HD_BACKEND picks the backend of HD_BACKEND_DEFAULT (and of NULL options);
 * an explicit backend wins. */
START_TEST(test_backend_env)
{
    hd_options def;
    hd_options_init(&def);
    hd_options ref;
    tu_options_ref(&ref);
    char err[256];
    hd_model *m;

    ck_assert_int_eq(setenv("HD_BACKEND", "nosuch", 1), 0);
    m = (hd_model *)&def;
    err[0] = '\0';
    ST_EQ(hd_model_synth(1, 8, "M", &def, &m, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
    ck_assert_msg(err[0] != '\0', "HD_BACKEND=nosuch: no message");
    printf("HD_BACKEND=nosuch: %s\n", err);
    m = (hd_model *)&def;
    ST_EQ(hd_model_synth(1, 8, "M", NULL, &m, NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
    /* Explicit wins over the environment. */
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, "M", &ref, &m, NULL, 0), HD_OK);
    ck_assert_int_eq(hd_model_backend(m), HD_BACKEND_REF);
    hd_model_free(m);

    ck_assert_int_eq(setenv("HD_BACKEND", "REF", 1), 0);
    m = (hd_model *)&def;
    ST_EQ(hd_model_synth(1, 8, "M", &def, &m, NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);

    ck_assert_int_eq(setenv("HD_BACKEND", "ref", 1), 0);
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, "M", &def, &m, NULL, 0), HD_OK);
    ck_assert_int_eq(hd_model_backend(m), HD_BACKEND_REF);
    ck_assert_ptr_ne(hd_model_backend_info(m), NULL);
    hd_model_free(m);
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, "M", NULL, &m, NULL, 0), HD_OK);
    ck_assert_int_eq(hd_model_backend(m), HD_BACKEND_REF);
    hd_model_free(m);

    /* Empty means auto: some real backend, never DEFAULT or AUTO. */
    ck_assert_int_eq(setenv("HD_BACKEND", "", 1), 0);
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, "M", &def, &m, NULL, 0), HD_OK);
    hd_backend got = hd_model_backend(m);
    ck_assert_msg(got == HD_BACKEND_REF || got == HD_BACKEND_CPU ||
                      got == HD_BACKEND_CUDA,
                  "auto chose backend %d", (int)got);
    hd_model_free(m);

    /* A named backend that is not usable is an error, not a fallback. */
    if (hd_backend_available(HD_BACKEND_CUDA, NULL, 0) != HD_OK) {
        ck_assert_int_eq(setenv("HD_BACKEND", "cuda", 1), 0);
        m = (hd_model *)&def;
        err[0] = '\0';
        ST_EQ(hd_model_synth(1, 8, "M", &def, &m, err, sizeof err),
              HD_ERR_BACKEND_UNAVAILABLE);
        ck_assert_ptr_eq(m, NULL);
        ck_assert_msg(err[0] != '\0', "HD_BACKEND=cuda: no message");
    }

    ck_assert_int_eq(unsetenv("HD_BACKEND"), 0);
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, "M", &def, &m, NULL, 0), HD_OK);
    got = hd_model_backend(m);
    ck_assert(got == HD_BACKEND_REF || got == HD_BACKEND_CPU ||
              got == HD_BACKEND_CUDA);
    hd_model_free(m);
}
END_TEST

/* ---- creating models: bad arguments ------------------------------------- */

static void expect_synth_fails(int experts, const char *pattern,
                               hd_status want)
{
    hd_options opt;
    tu_options_ref(&opt);
    hd_model *m = (hd_model *)&opt;
    char err[256] = "";
    hd_status st = hd_model_synth(1, experts, pattern, &opt, &m, err,
                                  sizeof err);
    ck_assert_msg(st == want,
                  "hd_model_synth(E %d, pattern '%s') = %d (%s), expected %d",
                  experts, pattern ? pattern : "(null)", (int)st,
                  hd_status_string(st), (int)want);
    ck_assert_msg(m == NULL, "model not set to NULL on failure");
    ck_assert_msg(err[0] != '\0', "hd_model_synth(E %d, '%s'): no message",
                  experts, pattern ? pattern : "(null)");
}

START_TEST(test_model_bad_arguments)
{
    hd_options opt;
    tu_options_ref(&opt);
    hd_model *m = (hd_model *)&opt;
    char err[256] = "";

    ST_EQ(hd_model_load(NULL, &opt, &m, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
    ST_EQ(hd_model_load("whatever.safetensors", &opt, NULL, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_model_synth(1, 8, "KM", &opt, NULL, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);

    expect_synth_fails(7, "KM", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(0, "KM", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(-1, "KM", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(HD_MAX_EXPERTS + 1, "KM", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(8, "KXM", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(8, "", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(8, "km", HD_ERR_INVALID_ARGUMENT);
    expect_synth_fails(8, "K M", HD_ERR_INVALID_ARGUMENT);
    char longp[HD_MAX_LAYERS + 2];
    memset(longp, 'K', HD_MAX_LAYERS + 1);
    longp[HD_MAX_LAYERS + 1] = '\0';
    expect_synth_fails(8, longp, HD_ERR_INVALID_ARGUMENT);

    /* NULL pattern means "KKKM" (checked cheaply: no step). */
    m = NULL;
    ST_EQ(hd_model_synth(1, 8, NULL, &opt, &m, NULL, 0), HD_OK);
    ck_assert_str_eq(hd_model_pattern(m), "KKKM");
    ck_assert_int_eq(hd_model_layers(m), 4);
    ck_assert_int_eq(hd_model_experts(m), 8);
    ck_assert_uint_gt(hd_model_weight_bytes(m), 0);
    hd_model_free(m);

    /* hd_model_save with NULLs. */
    hd_model *ok = tu_synth_ref(1, 8, "M");
    ST_EQ(hd_model_save(NULL, "x.safetensors", NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_model_save(ok, NULL, NULL, 0), HD_ERR_INVALID_ARGUMENT);
    hd_model_free(ok);

    /* Synthetic inputs. */
    ST_EQ(hd_synth_input(1, 0, NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_synth_cache(1, 3, NULL, NULL), HD_OK);
}
END_TEST

/* Accessors and frees on NULL. */
START_TEST(test_null_accessors)
{
    hd_model_free(NULL);
    hd_state_free(NULL);
    ck_assert_int_eq(hd_model_experts(NULL), 0);
    ck_assert_int_eq(hd_model_layers(NULL), 0);
    ck_assert_ptr_ne(hd_model_pattern(NULL), NULL);
    ck_assert_str_eq(hd_model_pattern(NULL), "");
    ck_assert_uint_eq(hd_state_context(NULL), 0);
    ck_assert_uint_eq(hd_state_capacity(NULL), 0);
    ST_EQ(hd_state_reset(NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_prefill(NULL, 0, NULL, NULL), HD_ERR_INVALID_ARGUMENT);
    uint16_t buf[8] = {0};
    ST_EQ(hd_state_export(NULL, 0, HD_STATE_S, buf, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(NULL, 0, HD_STATE_S, buf, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
}
END_TEST

/* The error buffer: NUL-terminated within err_size, nothing written past
 * it, nothing at all with size 0. */
START_TEST(test_error_buffer)
{
    hd_options opt;
    tu_options_ref(&opt);
    char buf[64];
    hd_model *m;

    memset(buf, 'X', sizeof buf);
    m = (hd_model *)&opt;
    ST_EQ(hd_model_synth(1, 7, "KM", &opt, &m, buf, 8),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_msg(memchr(buf, '\0', 8) != NULL,
                  "message not NUL-terminated within err_size");
    for (size_t i = 8; i < sizeof buf; i++)
        ck_assert_msg(buf[i] == 'X', "byte %zu past err_size written", i);

    memset(buf, 'X', sizeof buf);
    ST_EQ(hd_model_synth(1, 7, "KM", &opt, &m, buf, 1),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(buf[0], '\0');
    ck_assert_int_eq(buf[1], 'X');

    memset(buf, 'X', sizeof buf);
    ST_EQ(hd_model_synth(1, 7, "KM", &opt, &m, buf, 0),
          HD_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof buf; i++)
        ck_assert_msg(buf[i] == 'X', "err_size 0: byte %zu written", i);

    ST_EQ(hd_model_synth(1, 7, "KM", &opt, &m, NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
}
END_TEST

/* ---- states: bad arguments ----------------------------------------------- */

static hd_model *g_km;   /* E=8 "KM", seed 1 */
static hd_model *g_km2;  /* E=8 "KM", seed 2: same shapes, another model */
static hd_model *g_m;    /* E=8 "M" */

static void models_setup(void)
{
    g_km = tu_synth_ref(1, 8, "KM");
    g_km2 = tu_synth_ref(2, 8, "KM");
    g_m = tu_synth_ref(1, 8, "M");
}

static void models_teardown(void)
{
    hd_model_free(g_km);
    hd_model_free(g_km2);
    hd_model_free(g_m);
    g_km = g_km2 = g_m = NULL;
}

/* A state of g_km with one step done (non-zero KDA state, context 1). */
static hd_state *stepped_state(size_t capacity)
{
    hd_state *s = tu_state_new(g_km, capacity);
    uint16_t in[D], out[D];
    tu_input(1, 0, in);
    tu_step(g_km, s, in, out);
    return s;
}

static void assert_unchanged(const hd_state *s, const tu_snapshot *before,
                             const char *what)
{
    tu_snapshot *now = tu_snapshot_take(g_km, s);
    bool same = tu_snapshot_equal(before, now);
    tu_snapshot_free(now);
    ck_assert_msg(same, "%s changed the state", what);
}

START_TEST(test_state_new_bad)
{
    hd_state *s = (hd_state *)&s;
    ST_EQ(hd_state_new(NULL, 4, &s), HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(s, NULL);
    ST_EQ(hd_state_new(g_km, 4, NULL), HD_ERR_INVALID_ARGUMENT);
    s = (hd_state *)&s;
    ST_EQ(hd_state_new(g_km, SIZE_MAX, &s), HD_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_eq(s, NULL);
    s = (hd_state *)&s;
    ST_EQ(hd_state_new(g_km, SIZE_MAX / 2, &s), HD_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_eq(s, NULL);

    s = tu_state_new(g_km, 0);
    ck_assert_uint_eq(hd_state_capacity(s), 0);
    ck_assert_uint_eq(hd_state_context(s), 0);
    hd_state_free(s);
}
END_TEST

START_TEST(test_step_bad_arguments)
{
    hd_state *s = stepped_state(8);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    uint16_t in[D], out[D], guard[D];
    tu_input(1, 1, in);
    for (size_t i = 0; i < D; i++)
        guard[i] = (uint16_t)(0x1234u + i);

    memcpy(out, guard, sizeof out);
    ST_EQ(hd_step(NULL, s, in, out), HD_ERR_INVALID_ARGUMENT);
    ck_assert(memcmp(out, guard, sizeof out) == 0);
    ST_EQ(hd_step(g_km, NULL, in, out), HD_ERR_INVALID_ARGUMENT);
    ck_assert(memcmp(out, guard, sizeof out) == 0);
    ST_EQ(hd_step(g_km, s, NULL, out), HD_ERR_INVALID_ARGUMENT);
    ck_assert(memcmp(out, guard, sizeof out) == 0);
    ST_EQ(hd_step(g_km, s, in, NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_step(NULL, NULL, NULL, NULL), HD_ERR_INVALID_ARGUMENT);
    ck_assert_uint_eq(hd_state_context(s), 1);
    assert_unchanged(s, before, "hd_step with a NULL argument");

    tu_snapshot_free(before);
    hd_state_free(s);
}
END_TEST

START_TEST(test_export_import_bad)
{
    hd_state *s = stepped_state(8);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    const size_t ckv_bytes = 1 * 512 * 2; /* context 1 */
    unsigned char *buf = tu_xmalloc(S_BYTES + 64);
    unsigned char *guard = tu_xmalloc(S_BYTES + 64);
    for (size_t i = 0; i < S_BYTES + 64; i++)
        guard[i] = (unsigned char)(i * 7 + 3);

    /* NULL buffers. */
    ST_EQ(hd_state_export(s, 0, HD_STATE_S, NULL, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, 0, HD_STATE_S, NULL, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_export(s, 0, HD_STATE_CONV_K, NULL, CONV_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, 1, HD_STATE_C_KV, NULL, ckv_bytes),
          HD_ERR_INVALID_ARGUMENT);

    /* Wrong sizes: export writes nothing, import changes nothing. */
    const size_t wrong_s[] = {S_BYTES - 1, S_BYTES + 1, S_BYTES - 4,
                              S_BYTES + 4, 0, S_BYTES / 2, CONV_BYTES};
    for (size_t i = 0; i < sizeof wrong_s / sizeof wrong_s[0]; i++) {
        memcpy(buf, guard, S_BYTES + 64);
        hd_status st = hd_state_export(s, 0, HD_STATE_S, buf, wrong_s[i]);
        ck_assert_msg(st == HD_ERR_SIZE_MISMATCH,
                      "export S with %zu bytes = %d (%s)", wrong_s[i], (int)st,
                      hd_status_string(st));
        ck_assert_msg(memcmp(buf, guard, S_BYTES + 64) == 0,
                      "a failed export (%zu bytes) wrote the buffer",
                      wrong_s[i]);
        st = hd_state_import(s, 0, HD_STATE_S, guard, wrong_s[i]);
        ck_assert_msg(st == HD_ERR_SIZE_MISMATCH,
                      "import S with %zu bytes = %d (%s)", wrong_s[i], (int)st,
                      hd_status_string(st));
    }
    const size_t wrong_conv[] = {CONV_BYTES - 2, CONV_BYTES + 2, 0, S_BYTES};
    for (size_t i = 0; i < sizeof wrong_conv / sizeof wrong_conv[0]; i++)
        for (int w = HD_STATE_CONV_Q; w <= HD_STATE_CONV_V; w++) {
            ST_EQ(hd_state_export(s, 0, (hd_state_tensor)w, buf, wrong_conv[i]),
                  HD_ERR_SIZE_MISMATCH);
            ST_EQ(hd_state_import(s, 0, (hd_state_tensor)w, guard,
                                  wrong_conv[i]),
                  HD_ERR_SIZE_MISMATCH);
        }
    /* MLA tensors are sized for the current context (1 row). */
    const size_t wrong_ckv[] = {ckv_bytes - 2, ckv_bytes + 2, 2 * 512 * 2,
                                0, 8 * 512 * 2};
    for (size_t i = 0; i < sizeof wrong_ckv / sizeof wrong_ckv[0]; i++) {
        memcpy(buf, guard, S_BYTES + 64);
        ST_EQ(hd_state_export(s, 1, HD_STATE_C_KV, buf, wrong_ckv[i]),
              HD_ERR_SIZE_MISMATCH);
        ck_assert(memcmp(buf, guard, S_BYTES + 64) == 0);
        ST_EQ(hd_state_import(s, 1, HD_STATE_C_KV, guard, wrong_ckv[i]),
              HD_ERR_SIZE_MISMATCH);
    }
    ST_EQ(hd_state_export(s, 1, HD_STATE_K_ROPE, buf, 2 * 64 * 2),
          HD_ERR_SIZE_MISMATCH);
    ST_EQ(hd_state_import(s, 1, HD_STATE_K_ROPE, guard, 1 * 64 * 2 + 1),
          HD_ERR_SIZE_MISMATCH);

    /* Tensors a layer does not have, layers out of range. */
    ST_EQ(hd_state_export(s, 1, HD_STATE_S, buf, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, 1, HD_STATE_S, guard, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_export(s, 0, HD_STATE_C_KV, buf, ckv_bytes),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, 0, HD_STATE_K_ROPE, guard, 1 * 64 * 2),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_export(s, 2, HD_STATE_S, buf, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, -1, HD_STATE_S, guard, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_export(s, 0, (hd_state_tensor)6, buf, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(s, 0, (hd_state_tensor)-1, guard, S_BYTES),
          HD_ERR_INVALID_ARGUMENT);

    ck_assert_uint_eq(hd_state_context(s), 1);
    assert_unchanged(s, before, "a failed export/import");

    free(buf);
    free(guard);
    tu_snapshot_free(before);
    hd_state_free(s);
}
END_TEST

START_TEST(test_prefill_bad)
{
    hd_state *s = stepped_state(8);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    uint16_t *ckv = tu_xcalloc(3 * 512, 2);
    uint16_t *kr = tu_xcalloc(3 * 64, 2);
    ST_EQ(hd_state_prefill(s, 3, NULL, kr), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_prefill(s, 3, ckv, NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_prefill(s, 3, NULL, NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_prefill(s, 9, ckv, kr), HD_ERR_CACHE_FULL);
    ST_EQ(hd_state_prefill(s, SIZE_MAX, ckv, kr), HD_ERR_CACHE_FULL);
    ck_assert_uint_eq(hd_state_context(s), 1);
    assert_unchanged(s, before, "a failed prefill");
    free(ckv);
    free(kr);
    tu_snapshot_free(before);
    hd_state_free(s);
}
END_TEST

/* A state made for one model, stepped with another. */
START_TEST(test_state_mismatch)
{
    hd_state *s = stepped_state(8);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    uint16_t in[D], out[D], guard[D];
    tu_input(1, 1, in);
    for (size_t i = 0; i < D; i++)
        guard[i] = (uint16_t)(0x4321u + 3 * i);

    memcpy(out, guard, sizeof out);
    ST_EQ(hd_step(g_km2, s, in, out), HD_ERR_STATE_MISMATCH);
    ck_assert_msg(memcmp(out, guard, sizeof out) == 0,
                  "a mismatched step wrote the output");
    ST_EQ(hd_step(g_m, s, in, out), HD_ERR_STATE_MISMATCH);
    ck_assert_msg(memcmp(out, guard, sizeof out) == 0,
                  "a mismatched step wrote the output");
    ck_assert_uint_eq(hd_state_context(s), 1);
    assert_unchanged(s, before, "a step with another model");

    /* And the other way round: a state of g_m with g_km. */
    hd_state *sm = tu_state_new(g_m, 4);
    ST_EQ(hd_step(g_km, sm, in, out), HD_ERR_STATE_MISMATCH);
    ck_assert_uint_eq(hd_state_context(sm), 0);
    hd_state_free(sm);

    tu_snapshot_free(before);
    hd_state_free(s);
}
END_TEST

/* NaN or infinite input: HD_ERR_NONFINITE, nothing changed; a good step
 * afterwards gives what it would have given without the bad calls. */
START_TEST(test_nonfinite_input)
{
    hd_state *s = stepped_state(8);
    hd_state *twin = stepped_state(8);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    static const uint16_t bad[] = {0x7fc0, 0xffc0, 0x7f81, 0x7fff,
                                   0x7f80, 0xff80};
    static const size_t pos[] = {0, 1234, D - 1};
    uint16_t good[D], in[D], out[D], guard[D];
    tu_input(1, 1, good);
    for (size_t i = 0; i < D; i++)
        guard[i] = (uint16_t)(0x3f80u + i);

    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            memcpy(in, good, sizeof in);
            in[pos[p]] = bad[b];
            memcpy(out, guard, sizeof out);
            hd_status st = hd_step(g_km, s, in, out);
            ck_assert_msg(st == HD_ERR_NONFINITE,
                          "input[%zu] = 0x%04x: hd_step = %d (%s), expected "
                          "HD_ERR_NONFINITE",
                          pos[p], bad[b], (int)st, hd_status_string(st));
            ck_assert_msg(memcmp(out, guard, sizeof out) == 0,
                          "input[%zu] = 0x%04x: output written", pos[p],
                          bad[b]);
            ck_assert_uint_eq(hd_state_context(s), 1);
            /* In place: the buffer stays as it was. */
            uint16_t keep[D];
            memcpy(keep, in, sizeof keep);
            ST_EQ(hd_step(g_km, s, in, in), HD_ERR_NONFINITE);
            ck_assert(memcmp(keep, in, sizeof in) == 0);
        }
    assert_unchanged(s, before, "a step with non-finite input");

    uint16_t o1[D], o2[D];
    tu_step(g_km, s, good, o1);
    tu_step(g_km, twin, good, o2);
    ck_assert_msg(memcmp(o1, o2, sizeof o1) == 0,
                  "rejected steps changed what the next step computes");

    tu_snapshot_free(before);
    hd_state_free(s);
    hd_state_free(twin);
}
END_TEST

/* in == out gives the same result as separate buffers. */
START_TEST(test_in_place_step)
{
    hd_state *a = tu_state_new(g_km, 8);
    hd_state *b = tu_state_new(g_km, 8);
    uint16_t in[D], out[D], io[D];
    tu_input(1, 0, in);
    tu_step(g_km, a, in, out);
    memcpy(io, in, sizeof io);
    tu_step(g_km, b, io, io);
    ck_assert_msg(memcmp(out, io, sizeof out) == 0, "in-place output differs");
    /* Feeding the output back in place, too. */
    tu_step(g_km, a, out, in);
    tu_step(g_km, b, io, io);
    ck_assert_msg(memcmp(in, io, sizeof in) == 0,
                  "chained in-place output differs");
    hd_state_free(a);
    hd_state_free(b);
}
END_TEST

/* ---- misuse ------------------------------------------------------------- */

/* hd_options from an older or foreign caller: struct_size below what this
 * library knows is refused; invalid fields are refused; the model stays
 * NULL. */
START_TEST(test_options_misuse)
{
    hd_options opt;
    char err[256];
    static const size_t small[] = {1, sizeof(size_t), sizeof(hd_options) - 1};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        tu_options_ref(&opt);
        opt.struct_size = small[i];
        hd_model *m = (hd_model *)&opt;
        err[0] = 0;
        ST_EQ(hd_model_synth(1, 8, "M", &opt, &m, err, sizeof err),
              HD_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_eq(m, NULL);
        ck_assert_msg(strstr(err, "struct_size") != NULL, "message '%s'", err);
    }
    tu_options_ref(&opt);
    opt.threads = -1;
    hd_model *m = (hd_model *)&opt;
    ST_EQ(hd_model_synth(1, 8, "M", &opt, &m, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
    tu_options_ref(&opt);
    opt.device = -3;
    ST_EQ(hd_model_synth(1, 8, "M", &opt, &m, err, sizeof err),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(m, NULL);
    tu_options_ref(&opt);
    opt.backend = (hd_backend)99;
    ck_assert_int_ne(hd_model_synth(1, 8, "M", &opt, &m, err, sizeof err), HD_OK);
    ck_assert_ptr_eq(m, NULL);
    ck_assert_int_ne(hd_backend_available((hd_backend)99, NULL, 0), HD_OK);
    ck_assert_int_ne(hd_backend_available((hd_backend)-1, NULL, 0), HD_OK);
}
END_TEST

/* What a freed object looks like where it can be detected: hd_*_free
 * clears the magic number.  Reading freed memory is undefined, so this
 * uses objects whose magic is cleared (zeroed memory) and objects of the
 * other kind (a state passed as a model and the reverse): every call
 * refuses them and the live objects are untouched. */
START_TEST(test_dead_and_foreign_objects)
{
    static uint64_t zeros[16384]; /* larger than any of the structs */
    const hd_model *dead_model = (const hd_model *)(void *)zeros;
    hd_state *dead_state = (hd_state *)(void *)zeros;
    hd_state *s = stepped_state(4);
    tu_snapshot *before = tu_snapshot_take(g_km, s);
    uint16_t in[D], out[D];
    tu_input(1, 1, in);

    hd_state *n = (hd_state *)&n;
    ST_EQ(hd_state_new(dead_model, 4, &n), HD_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(n, NULL);
    ST_EQ(hd_step(dead_model, s, in, out), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_step(g_km, dead_state, in, out), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_reset(dead_state), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_prefill(dead_state, 0, NULL, NULL), HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_state_import(dead_state, 0, HD_STATE_S, in, 0),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_model_save(dead_model, "hdtest-never.safetensors", NULL, 0),
          HD_ERR_INVALID_ARGUMENT);
    ck_assert_uint_eq(hd_state_context(dead_state), 0);
    ck_assert_int_eq(hd_model_layers(dead_model), 0);
    ck_assert_str_eq(hd_model_backend_info(dead_model), "");
    hd_state_free(dead_state);           /* ignored */
    hd_model_free((hd_model *)dead_model); /* ignored */

    /* Type confusion: the magic numbers differ per kind. */
    ST_EQ(hd_state_new((const hd_model *)(void *)s, 4, &n),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_step((const hd_model *)(void *)s, s, in, out),
          HD_ERR_INVALID_ARGUMENT);
    ST_EQ(hd_step(g_km, (hd_state *)(void *)g_km, in, out),
          HD_ERR_INVALID_ARGUMENT);
    hd_model_free((hd_model *)(void *)s); /* not a model: ignored */
    hd_state_free((hd_state *)(void *)g_km); /* not a state: ignored */

    /* Frees of NULL, repeated. */
    hd_state_free(NULL);
    hd_state_free(NULL);
    hd_model_free(NULL);
    hd_model_free(NULL);

    assert_unchanged(s, before, "calls with dead or foreign objects");
    ck_assert_int_eq(hd_model_layers(g_km), 2); /* still alive */
    tu_step(g_km, s, in, out);
    tu_snapshot_free(before);
    hd_state_free(s);
}
END_TEST

static Suite *api_suite(void)
{
    Suite *s = suite_create("api");

    TCase *tc = tcase_create("basics");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_version);
    tcase_add_test(tc, test_backend_names);
    tcase_add_test(tc, test_backend_available);
    tcase_add_test(tc, test_backend_unavailable);
    tcase_add_test(tc, test_options_init);
    tcase_add_test(tc, test_backend_env);
    tcase_add_test(tc, test_model_bad_arguments);
    tcase_add_test(tc, test_null_accessors);
    tcase_add_test(tc, test_error_buffer);
    suite_add_tcase(s, tc);

    tc = tcase_create("states");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_unchecked_fixture(tc, models_setup, models_teardown);
    tcase_add_test(tc, test_state_new_bad);
    tcase_add_test(tc, test_step_bad_arguments);
    tcase_add_test(tc, test_export_import_bad);
    tcase_add_test(tc, test_prefill_bad);
    tcase_add_test(tc, test_state_mismatch);
    tcase_add_test(tc, test_nonfinite_input);
    tcase_add_test(tc, test_in_place_step);
    tcase_add_test(tc, test_options_misuse);
    tcase_add_test(tc, test_dead_and_foreign_objects);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* The backend tests set HD_BACKEND themselves; start from a clean slate
     * so that the caller's environment cannot change the results. */
    unsetenv("HD_BACKEND");
    return tu_run_suite(api_suite());
}
