/* test_model.c - model files: save and load round trip, the layout of a
 * saved file, and malformed files (model-level and byte-level), each of
 * which must fail with the documented status, a message that names the
 * problem, and a NULL model. */
#include "config.h"

#include <dirent.h>
#if defined(HAVE_MALLOC_TRIM) && defined(HAVE_MALLOC_H)
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "testutil.h"

#define D HD_HIDDEN

/* ---- helpers ---------------------------------------------------------------- */

static hd_status load_ref(const char *path, hd_model **model, char *err,
                          size_t err_size)
{
    hd_options opt;
    tu_options_ref(&opt);
    return hd_model_load(path, &opt, model, err, err_size);
}

static char *save_temp(const hd_model *model, const char *tag)
{
    char *path = tu_temp_path(tag);
    char err[512] = "";
    hd_status st = hd_model_save(model, path, err, sizeof err);
    ck_assert_msg(st == HD_OK, "hd_model_save('%s') = %d (%s): %s", path,
                  (int)st, hd_status_string(st), err);
    return path;
}

/* Whether msg contains one of the '|'-separated needles. */
static bool contains_any(const char *msg, const char *needles)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", needles);
    for (char *tok = strtok(buf, "|"); tok; tok = strtok(NULL, "|"))
        if (strstr(msg, tok) != NULL)
            return true;
    return false;
}

/* Loading `path` fails with `want`, a message (containing one of `needles`
 * when not NULL), and a NULL model. */
static void expect_load_fails(const char *path, hd_status want,
                              const char *needles, const char *what)
{
    char err[512];
    memset(err, 0, sizeof err);
    hd_model *m = (hd_model *)err; /* must be set to NULL */
    hd_status st = load_ref(path, &m, err, sizeof err);
    if (st == HD_OK)
        hd_model_free(m);
    ck_assert_msg(st == want, "%s: hd_model_load = %d (%s), expected %d (%s); "
                  "message: '%s'", what, (int)st, hd_status_string(st),
                  (int)want, hd_status_string(want), err);
    ck_assert_msg(m == NULL, "%s: model not set to NULL on failure", what);
    ck_assert_msg(err[0] != '\0', "%s: no error message", what);
    if (needles)
        ck_assert_msg(contains_any(err, needles),
                      "%s: message '%s' does not name '%s'", what, err,
                      needles);
    printf("%-44s -> %s: %s\n", what, hd_status_string(st), err);
    fflush(stdout);
}

/* ---- rewriting a saved file ------------------------------------------------- */

#define MAX_OWNED 64
#define MAX_META 8

typedef struct edit {
    hd_st_file file; /* the base, open */
    hd_st_out *t;
    size_t n, cap;
    hd_st_meta meta[MAX_META];
    size_t n_meta;
    void *owned[MAX_OWNED];
    int n_owned;
} edit;

static edit *edit_open(const char *base)
{
    edit *e = tu_xcalloc(1, sizeof *e);
    char err[512] = "";
    hd_status st = hd_st_open(base, &e->file, err, sizeof err);
    ck_assert_msg(st == HD_OK, "hd_st_open('%s') = %d: %s", base, (int)st, err);
    e->cap = e->file.n_tensors + 8;
    e->t = tu_xcalloc(e->cap, sizeof *e->t);
    for (size_t i = 0; i < e->file.n_tensors; i++) {
        const hd_st_tensor *s = &e->file.tensors[i];
        hd_st_out *o = &e->t[e->n++];
        o->name = s->name;
        o->dtype = s->dtype;
        o->ndim = s->ndim;
        memcpy(o->shape, s->shape, sizeof o->shape);
        o->data = s->data;
        o->bytes = s->end - s->begin;
    }
    ck_assert_uint_le(e->file.n_meta, MAX_META);
    for (size_t i = 0; i < e->file.n_meta; i++) {
        e->meta[i].key = strdup(e->file.meta[i].key);
        e->meta[i].value = strdup(e->file.meta[i].value);
        ck_assert(e->meta[i].key && e->meta[i].value);
    }
    e->n_meta = e->file.n_meta;
    return e;
}

static void *edit_alloc(edit *e, size_t bytes)
{
    ck_assert_int_lt(e->n_owned, MAX_OWNED);
    void *p = tu_xcalloc(1, bytes);
    e->owned[e->n_owned++] = p;
    return p;
}

static hd_st_out *edit_find(edit *e, const char *name)
{
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->t[i].name, name) == 0)
            return &e->t[i];
    ck_abort_msg("tensor '%s' not in the base file", name);
    return NULL;
}

static void edit_drop(edit *e, const char *name)
{
    hd_st_out *o = edit_find(e, name);
    size_t i = (size_t)(o - e->t);
    memmove(&e->t[i], &e->t[i + 1], (e->n - i - 1) * sizeof *e->t);
    e->n--;
}

/* Adds a zero-filled tensor. */
static hd_st_out *edit_add(edit *e, const char *name, hd_dtype dtype, int ndim,
                           const uint64_t *shape)
{
    ck_assert_uint_lt(e->n, e->cap);
    hd_st_out *o = &e->t[e->n++];
    memset(o, 0, sizeof *o);
    o->name = name;
    o->dtype = dtype;
    o->ndim = ndim;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        o->shape[i] = shape[i];
        count *= shape[i];
    }
    o->bytes = count * (dtype == HD_DT_BF16 ? 2 : 1);
    o->data = edit_alloc(e, (size_t)o->bytes);
    return o;
}

/* Sets (value != NULL) or removes a __metadata__ key. */
static void edit_meta(edit *e, const char *key, const char *value)
{
    for (size_t i = 0; i < e->n_meta; i++) {
        if (strcmp(e->meta[i].key, key) != 0)
            continue;
        free(e->meta[i].value);
        if (value) {
            e->meta[i].value = strdup(value);
            ck_assert(e->meta[i].value != NULL);
        } else {
            free(e->meta[i].key);
            memmove(&e->meta[i], &e->meta[i + 1],
                    (e->n_meta - i - 1) * sizeof e->meta[0]);
            e->n_meta--;
        }
        return;
    }
    if (value) {
        ck_assert_uint_lt(e->n_meta, MAX_META);
        e->meta[e->n_meta].key = strdup(key);
        e->meta[e->n_meta].value = strdup(value);
        ck_assert(e->meta[e->n_meta].key && e->meta[e->n_meta].value);
        e->n_meta++;
    }
}

/* Keeps the first `count` experts of a bank / router (leading dimension). */
static void edit_slice_experts(edit *e, const char *name, uint64_t count)
{
    hd_st_out *o = edit_find(e, name);
    uint64_t per = o->bytes / o->shape[0];
    o->shape[0] = count;
    o->bytes = per * count;
}

/* Grows a bank / router to `count` experts, repeating expert 0's bytes. */
static void edit_grow_experts(edit *e, const char *name, uint64_t count)
{
    hd_st_out *o = edit_find(e, name);
    uint64_t per = o->bytes / o->shape[0];
    unsigned char *p = edit_alloc(e, (size_t)(per * count));
    memcpy(p, o->data, (size_t)o->bytes);
    for (uint64_t j = o->shape[0]; j < count; j++)
        memcpy(p + j * per, o->data, (size_t)per);
    o->shape[0] = count;
    o->bytes = per * count;
    o->data = p;
}

static char *edit_write(edit *e, const char *tag)
{
    char *path = tu_temp_path(tag);
    char err[512] = "";
    hd_status st = hd_st_write(path, e->t, e->n, e->n_meta ? e->meta : NULL,
                               e->n_meta, err, sizeof err);
    ck_assert_msg(st == HD_OK, "hd_st_write(%s) = %d: %s", tag, (int)st, err);
    return path;
}

static void edit_free(edit *e)
{
    for (int i = 0; i < e->n_owned; i++)
        free(e->owned[i]);
    for (size_t i = 0; i < e->n_meta; i++) {
        free(e->meta[i].key);
        free(e->meta[i].value);
    }
    free(e->t);
    hd_st_close(&e->file);
    free(e);
}

/* Writes the edit and expects hd_model_load to fail as described. */
static void edit_expect(edit *e, hd_status want, const char *needles,
                        const char *what)
{
    char *path = edit_write(e, "bad");
    expect_load_fails(path, want, needles, what);
    tu_remove(path);
}

/* Writes the edit and expects it to load; returns the model and, in *path,
 * the file (the reference backend reads the mapping: remove the file only
 * after freeing the model). */
static hd_model *edit_expect_ok(edit *e, const char *what, char **path_out)
{
    char *path = edit_write(e, "good");
    char err[512] = "";
    hd_model *m = NULL;
    hd_status st = load_ref(path, &m, err, sizeof err);
    ck_assert_msg(st == HD_OK, "%s: hd_model_load = %d (%s): %s", what,
                  (int)st, hd_status_string(st), err);
    *path_out = path;
    return m;
}

/* One step from a new state, from seed 3's input 0. */
static void one_step(const hd_model *m, uint16_t *out)
{
    hd_state *s = tu_state_new(m, 4);
    uint16_t in[D];
    tu_input(3, 0, in);
    tu_step(m, s, in, out);
    hd_state_free(s);
}

/* ---- save / load ------------------------------------------------------------ */

static hd_model *g_model; /* synth seed 3, E 8, KKKM */
static char *g_path;      /* g_model saved */

static void saved_setup(void)
{
    g_model = tu_synth_ref(3, 8, "KKKM");
    g_path = save_temp(g_model, "kkkm");
}

static void saved_teardown(void)
{
    hd_model_free(g_model);
    g_model = NULL;
    tu_remove(g_path);
    g_path = NULL;
}

START_TEST(test_save_load_identical)
{
    hd_model *loaded = NULL;
    char err[512] = "";
    hd_status st = load_ref(g_path, &loaded, err, sizeof err);
    ck_assert_msg(st == HD_OK, "hd_model_load = %d (%s): %s", (int)st,
                  hd_status_string(st), err);
    ck_assert_ptr_ne(loaded, NULL);
    ck_assert_int_eq(hd_model_backend(loaded), HD_BACKEND_REF);
    ck_assert_int_eq(hd_model_experts(loaded), hd_model_experts(g_model));
    ck_assert_int_eq(hd_model_experts(loaded), 8);
    ck_assert_int_eq(hd_model_layers(loaded), hd_model_layers(g_model));
    ck_assert_str_eq(hd_model_pattern(loaded), hd_model_pattern(g_model));
    ck_assert_str_eq(hd_model_pattern(loaded), "KKKM");
    ck_assert_uint_eq(hd_model_weight_bytes(loaded),
                      hd_model_weight_bytes(g_model));

    /* 3 steps, 1 at the small size (tu_small: valgrind). */
    const int steps = tu_size(3, 1);
    hd_state *a = tu_state_new(g_model, 8);
    hd_state *b = tu_state_new(loaded, 8);
    uint16_t in[D], oa[D], ob[D];
    for (uint64_t t = 0; t < (uint64_t)steps; t++) {
        tu_input(3, t, in);
        tu_step(g_model, a, in, oa);
        tu_step(loaded, b, in, ob);
        ck_assert_msg(memcmp(oa, ob, sizeof oa) == 0,
                      "step %llu: the loaded model gives another output",
                      (unsigned long long)t);
    }
    tu_snapshot *sa = tu_snapshot_take(g_model, a);
    tu_snapshot *sb = tu_snapshot_take(loaded, b);
    ck_assert_msg(tu_snapshot_equal(sa, sb), "states differ after %d steps",
                  steps);
    tu_snapshot_free(sa);
    tu_snapshot_free(sb);
    hd_state_free(a);
    hd_state_free(b);

    hd_model_free(loaded);
}
END_TEST

typedef struct want_tensor {
    char name[96];
    hd_dtype dtype;
    int ndim;
    uint64_t shape[3];
} want_tensor;

static void want_add(want_tensor *w, size_t *n, const char *name,
                     hd_dtype dtype, int ndim, uint64_t a, uint64_t b,
                     uint64_t c)
{
    want_tensor *t = &w[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
}

/* A quantized linear (bank of `count`, or none when count == 0). */
static void want_quant(want_tensor *w, size_t *n, const char *prefix,
                       uint64_t count, uint64_t k, uint64_t nn)
{
    char name[96];
    snprintf(name, sizeof name, "%s.w_q", prefix);
    if (count)
        want_add(w, n, name, HD_DT_U8, 3, count, k / 2, nn);
    else
        want_add(w, n, name, HD_DT_U8, 2, k / 2, nn, 0);
    snprintf(name, sizeof name, "%s.scales", prefix);
    if (count)
        want_add(w, n, name, HD_DT_BF16, 3, count, k / 128, nn);
    else
        want_add(w, n, name, HD_DT_BF16, 2, k / 128, nn, 0);
    snprintf(name, sizeof name, "%s.zeros", prefix);
    if (count)
        want_add(w, n, name, HD_DT_BF16, 3, count, k / 128, nn);
    else
        want_add(w, n, name, HD_DT_BF16, 2, k / 128, nn, 0);
}

/* Every tensor of the seed's module for a pattern and E (SYNTH.md). */
static size_t want_model(want_tensor *w, const char *pattern, uint64_t E)
{
    size_t n = 0;
    char p[96], q[96];
    for (int i = 0; pattern[i]; i++) {
        snprintf(p, sizeof p, "blocks.%d.attn_norm", i);
        want_add(w, &n, p, HD_DT_BF16, 1, D, 0, 0);
        snprintf(p, sizeof p, "blocks.%d.moe_norm", i);
        want_add(w, &n, p, HD_DT_BF16, 1, D, 0, 0);
        if (pattern[i] == 'K') {
            static const char *const proj[] = {"q_proj", "k_proj", "v_proj",
                                               "g_proj"};
            for (int j = 0; j < 4; j++) {
                snprintf(q, sizeof q, "blocks.%d.attn.%s", i, proj[j]);
                want_quant(w, &n, q, 0, D, 4096);
            }
            snprintf(q, sizeof q, "blocks.%d.attn.o_proj", i);
            want_quant(w, &n, q, 0, 4096, D);
            snprintf(p, sizeof p, "blocks.%d.attn.beta_proj.weight", i);
            want_add(w, &n, p, HD_DT_BF16, 2, 32, D, 0);
            snprintf(p, sizeof p, "blocks.%d.attn.conv_w", i);
            want_add(w, &n, p, HD_DT_BF16, 3, 3, 4096, 4);
        } else {
            snprintf(q, sizeof q, "blocks.%d.attn.q_proj", i);
            want_quant(w, &n, q, 0, D, 6144);
            snprintf(q, sizeof q, "blocks.%d.attn.kv_a", i);
            want_quant(w, &n, q, 0, D, 576);
            snprintf(q, sizeof q, "blocks.%d.attn.kv_b", i);
            want_quant(w, &n, q, 0, 512, 8192);
            snprintf(q, sizeof q, "blocks.%d.attn.o_proj", i);
            want_quant(w, &n, q, 0, 4096, D);
        }
        snprintf(p, sizeof p, "blocks.%d.moe.router.weight", i);
        want_add(w, &n, p, HD_DT_BF16, 2, E, D, 0);
        snprintf(q, sizeof q, "blocks.%d.moe.gate", i);
        want_quant(w, &n, q, E, D, HD_MOE_INTER);
        snprintf(q, sizeof q, "blocks.%d.moe.up", i);
        want_quant(w, &n, q, E, D, HD_MOE_INTER);
        snprintf(q, sizeof q, "blocks.%d.moe.down", i);
        want_quant(w, &n, q, E, HD_MOE_INTER, D);
        snprintf(q, sizeof q, "blocks.%d.moe.s_gate", i);
        want_quant(w, &n, q, 1, D, HD_MOE_INTER);
        snprintf(q, sizeof q, "blocks.%d.moe.s_up", i);
        want_quant(w, &n, q, 1, D, HD_MOE_INTER);
        snprintf(q, sizeof q, "blocks.%d.moe.s_down", i);
        want_quant(w, &n, q, 1, HD_MOE_INTER, D);
    }
    return n;
}

static void check_tensor(const hd_st_file *f, const char *name, hd_dtype dtype,
                         int ndim, uint64_t a, uint64_t b, uint64_t c)
{
    const hd_st_tensor *t = hd_st_find(f, name);
    ck_assert_msg(t != NULL, "tensor '%s' missing from the saved file", name);
    ck_assert_msg(t->dtype == dtype, "'%s': dtype %s", name, t->dtype_name);
    ck_assert_msg(t->ndim == ndim, "'%s': %d dimensions, expected %d", name,
                  t->ndim, ndim);
    const uint64_t want[3] = {a, b, c};
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(t->shape[i] == want[i],
                      "'%s': dimension %d is %llu, expected %llu", name, i,
                      (unsigned long long)t->shape[i],
                      (unsigned long long)want[i]);
}

START_TEST(test_saved_file_layout)
{
    hd_st_file f;
    memset(&f, 0, sizeof f);
    char err[512] = "";
    hd_status st = hd_st_open(g_path, &f, err, sizeof err);
    ck_assert_msg(st == HD_OK, "the saved file is not valid safetensors: %s",
                  err);

    /* The examples of the brief, spelled out. */
    check_tensor(&f, "blocks.0.attn.q_proj.w_q", HD_DT_U8, 2, 1152, 4096, 0);
    check_tensor(&f, "blocks.3.moe.down.scales", HD_DT_BF16, 3, 8, 8, 2304);
    check_tensor(&f, "blocks.3.attn.kv_b.w_q", HD_DT_U8, 2, 256, 8192, 0);
    check_tensor(&f, "blocks.0.attn.conv_w", HD_DT_BF16, 3, 3, 4096, 4);
    check_tensor(&f, "blocks.0.moe.router.weight", HD_DT_BF16, 2, 8, 2304, 0);

    /* Every tensor of the module, nothing else. */
    enum { MAX_WANT = 200 };
    want_tensor *w = tu_xcalloc(MAX_WANT, sizeof *w);
    size_t n = want_model(w, "KKKM", 8);
    ck_assert_uint_eq(n, 3 * 38 + 33);
    for (size_t i = 0; i < n; i++)
        check_tensor(&f, w[i].name, w[i].dtype, w[i].ndim, w[i].shape[0],
                     w[i].shape[1], w[i].shape[2]);
    ck_assert_msg(f.n_tensors == n, "the file has %zu tensors, expected %zu",
                  f.n_tensors, n);
    free(w);

    /* weight_bytes counts every tensor of the file. */
    uint64_t sum = 0;
    for (size_t i = 0; i < f.n_tensors; i++)
        sum += f.tensors[i].end - f.tensors[i].begin;
    ck_assert_uint_eq(sum, f.data_bytes);
    ck_assert_uint_eq(hd_model_weight_bytes(g_model), sum);

    const char *pattern = hd_st_meta_get(&f, "pattern");
    const char *experts = hd_st_meta_get(&f, "experts");
    ck_assert_msg(pattern != NULL, "__metadata__ lacks 'pattern'");
    ck_assert_msg(experts != NULL, "__metadata__ lacks 'experts'");
    ck_assert_str_eq(pattern, "KKKM");
    ck_assert_str_eq(experts, "8");

    /* SYNTH.md's norm rule: every value in [1 - 8/64, 1 + 7/64]. */
    const hd_st_tensor *norm = hd_st_find(&f, "blocks.0.attn_norm");
    ck_assert_ptr_ne(norm, NULL);
    for (size_t i = 0; i < D; i++) {
        uint16_t bits = (uint16_t)(norm->data[2 * i] |
                                   (norm->data[2 * i + 1] << 8));
        float v = tu_bf16_to_f32(bits);
        ck_assert_msg(v >= 1.0f - 8.0f / 64 && v <= 1.0f + 7.0f / 64,
                      "blocks.0.attn_norm[%zu] = %g", i, (double)v);
    }
    hd_st_close(&f);
}
END_TEST

/* ---- the saved bytes follow SYNTH.md ------------------------------------- */

static uint32_t lowbias32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint32_t fnv1a32(const char *str)
{
    uint32_t h = 0x811c9dc5u;
    for (const unsigned char *p = (const unsigned char *)str; *p; p++)
        h = (h ^ *p) * 0x01000193u;
    return h;
}

static uint16_t bf16_exact(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    ck_assert_msg((u & 0xffffu) == 0, "%g is not exact in bf16", (double)f);
    return (uint16_t)(u >> 16);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Scale exponent of a quantized linear, by its name without ".scales". */
static int scale_exp(const char *name, char kind)
{
    const char *p = strchr(name + strlen("blocks."), '.');
    ck_assert_ptr_ne(p, NULL);
    p++; /* "attn.q_proj" or "moe.gate" ... */
    if (strncmp(p, "moe.", 4) == 0)
        return -9;
    if (kind == 'K') {
        if (strcmp(p, "attn.q_proj") == 0)
            return -10;
        if (strcmp(p, "attn.k_proj") == 0)
            return -11;
        if (strcmp(p, "attn.v_proj") == 0 || strcmp(p, "attn.g_proj") == 0)
            return -8;
        if (strcmp(p, "attn.o_proj") == 0)
            return -9;
    } else {
        if (strcmp(p, "attn.q_proj") == 0 || strcmp(p, "attn.o_proj") == 0)
            return -9;
        if (strcmp(p, "attn.kv_a") == 0 || strcmp(p, "attn.kv_b") == 0)
            return -8;
    }
    ck_abort_msg("no scale rule for '%s' (kind %c)", name, kind);
    return 0;
}

/* SYNTH.md's value (a byte, or bf16 bits) of tensor `name` at flat index i,
 * for a layer of kind `kind`. */
static unsigned synth_value(uint32_t seed, const char *name, char kind,
                            uint32_t i)
{
    uint32_t u = lowbias32(i ^ lowbias32(fnv1a32(name) ^ seed));
    if (ends_with(name, ".w_q"))
        return u & 255u;
    if (ends_with(name, ".scales")) {
        char base[96];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - 7), name);
        int e = scale_exp(base, kind);
        return ((unsigned)(127 + e) << 7) | (u & 127u);
    }
    if (ends_with(name, ".zeros"))
        return bf16_exact(7.0f + 0.5f * (float)(u & 3u));
    if (ends_with(name, "attn_norm") || ends_with(name, "moe_norm"))
        return bf16_exact(1.0f + ((float)(u & 15u) - 8.0f) / 64.0f);
    int p = 0;
    if (ends_with(name, ".attn.beta_proj.weight"))
        p = -12;
    else if (ends_with(name, ".attn.conv_w"))
        p = -8;
    else if (ends_with(name, ".moe.router.weight"))
        p = -11;
    else
        ck_abort_msg("no SYNTH rule for '%s'", name);
    return bf16_exact(((float)(u & 255u) - 128.0f) * ldexpf(1.0f, p));
}

/* The rules above reproduce SYNTH.md's table of check values (seed 1). */
START_TEST(test_synth_rules_self_check)
{
    ck_assert_uint_eq(fnv1a32("blocks.0.attn_norm"), 2336447173u);
    ck_assert_uint_eq(lowbias32(1), 0x688990c0u);
    static const struct {
        const char *name;
        char kind;
        unsigned first[4];
    } cv[] = {
        {"blocks.0.attn_norm", 'K', {16264, 16224, 16262, 16240}},
        {"blocks.0.attn.q_proj.w_q", 'K', {116, 220, 211, 168}},
        {"blocks.0.attn.q_proj.scales", 'K', {14987, 14998, 14994, 14993}},
        {"blocks.0.attn.q_proj.zeros", 'K', {16608, 16624, 16624, 16624}},
        {"blocks.0.attn.conv_w", 'K', {16004, 16004, 15864, 48884}},
        {"blocks.2.attn.beta_proj.weight", 'K', {15444, 48008, 15376, 47776}},
        {"blocks.3.attn.kv_b.w_q", 'M', {184, 218, 100, 236}},
        {"blocks.3.moe.router.weight", 'M', {48482, 15596, 48442, 15392}},
        {"blocks.3.moe.down.w_q", 'M', {205, 61, 51, 148}},
        {"blocks.1.moe.s_up.scales", 'K', {15137, 15184, 15195, 15149}},
    };
    for (size_t i = 0; i < sizeof cv / sizeof cv[0]; i++)
        for (uint32_t j = 0; j < 4; j++)
            ck_assert_msg(synth_value(1, cv[i].name, cv[i].kind, j) ==
                              cv[i].first[j],
                          "rule for '%s'[%u] gives %u, SYNTH.md says %u",
                          cv[i].name, (unsigned)j,
                          synth_value(1, cv[i].name, cv[i].kind, j),
                          cv[i].first[j]);
}
END_TEST

/* Every tensor of the saved seed-3 file holds SYNTH.md's values under its
 * own name (a swap of two same-shaped tensors would load and run, so only
 * this catches it); sampled: the first and last 32 values and 256 spread. */
START_TEST(test_saved_synth_values)
{
    hd_st_file f;
    memset(&f, 0, sizeof f);
    char err[512] = "";
    ck_assert_msg(hd_st_open(g_path, &f, err, sizeof err) == HD_OK, "%s", err);
    const char *pattern = "KKKM";
    for (size_t t = 0; t < f.n_tensors; t++) {
        const hd_st_tensor *x = &f.tensors[t];
        int layer = atoi(x->name + strlen("blocks."));
        ck_assert_int_lt(layer, 4);
        char kind = pattern[layer];
        size_t esize = x->dtype == HD_DT_BF16 ? 2 : 1;
        uint64_t count = (x->end - x->begin) / esize;
        for (int k = 0; k < 32 + 32 + 256; k++) {
            uint64_t i = k < 32        ? (uint64_t)k
                         : k < 64      ? count - 1 - (uint64_t)(k - 32)
                                       : (uint64_t)(k - 64) * count / 256;
            if (i >= count)
                continue;
            unsigned got = esize == 2 ? (unsigned)(x->data[2 * i] |
                                                   (x->data[2 * i + 1] << 8))
                                      : (unsigned)x->data[i];
            unsigned want = synth_value(3, x->name, kind, (uint32_t)i);
            ck_assert_msg(got == want, "'%s'[%llu] = %u, SYNTH.md gives %u",
                          x->name, (unsigned long long)i, got, want);
        }
    }
    hd_st_close(&f);
}
END_TEST

START_TEST(test_save_errors)
{
    hd_model *m = tu_synth_ref(3, 8, "M");
    char err[512] = "";
    hd_status st = hd_model_save(m, "hdtest-no-such-dir/sub/x.safetensors",
                                 err, sizeof err);
    ck_assert_msg(st == HD_ERR_IO, "save into a missing folder = %d (%s)",
                  (int)st, hd_status_string(st));
    ck_assert_msg(err[0] != '\0', "no message for a failed save");
    char *dir = tu_temp_dir("savedir");
    st = hd_model_save(m, dir, err, sizeof err);
    ck_assert_msg(st == HD_ERR_IO, "save over a directory = %d (%s)", (int)st,
                  hd_status_string(st));
    /* No partial file left beside it. */
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.", dir);
    DIR *d = opendir(".");
    ck_assert_ptr_ne(d, NULL);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d)) != NULL)
        left += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    ck_assert_msg(left == 0, "a failed save left %d file(s) named %s*", left,
                  prefix);
    tu_remove_dir(dir);
    hd_model_free(m);
}
END_TEST

/* ---- malformed files -------------------------------------------------------- */

static hd_model *g_mmodel; /* synth seed 3, E 8, "M" */
static char *g_mbase;      /* g_mmodel saved */
static char *g_kbase;      /* synth seed 3, E 8, "K" saved */

static void malformed_setup(void)
{
    g_mmodel = tu_synth_ref(3, 8, "M");
    g_mbase = save_temp(g_mmodel, "mbase");
    hd_model *k = tu_synth_ref(3, 8, "K");
    g_kbase = save_temp(k, "kbase");
    hd_model_free(k);
}

static void malformed_teardown(void)
{
    hd_model_free(g_mmodel);
    g_mmodel = NULL;
    tu_remove(g_mbase);
    tu_remove(g_kbase);
    g_mbase = g_kbase = NULL;
}

/* Controls: rewriting the file unchanged, without __metadata__, or with an
 * extra metadata key loads, and gives the original's output. */
START_TEST(test_rewrite_controls)
{
    uint16_t want[D], got[D];
    one_step(g_mmodel, want);

    edit *e = edit_open(g_mbase);
    ck_assert_str_eq(hd_st_meta_get(&e->file, "pattern"), "M");
    ck_assert_str_eq(hd_st_meta_get(&e->file, "experts"), "8");
    char *path = NULL;
    hd_model *m = edit_expect_ok(e, "unchanged copy", &path);
    one_step(m, got);
    ck_assert(memcmp(want, got, sizeof want) == 0);
    hd_model_free(m);
    tu_remove(path);

    edit_meta(e, "format", "pt");
    m = edit_expect_ok(e, "extra metadata key", &path);
    hd_model_free(m);
    tu_remove(path);

    edit_meta(e, "format", NULL);
    edit_meta(e, "pattern", NULL);
    edit_meta(e, "experts", NULL);
    ck_assert_uint_eq(e->n_meta, 0);
    m = edit_expect_ok(e, "no __metadata__", &path);
    ck_assert_str_eq(hd_model_pattern(m), "M");
    ck_assert_int_eq(hd_model_experts(m), 8);
    one_step(m, got);
    ck_assert(memcmp(want, got, sizeof want) == 0);
    hd_model_free(m);
    tu_remove(path);
    edit_free(e);

    /* E = 9 built by growing every bank consistently is a valid model. */
    e = edit_open(g_mbase);
    static const char *const banks[] = {
        "blocks.0.moe.router.weight", "blocks.0.moe.gate.w_q",
        "blocks.0.moe.gate.scales",   "blocks.0.moe.gate.zeros",
        "blocks.0.moe.up.w_q",        "blocks.0.moe.up.scales",
        "blocks.0.moe.up.zeros",      "blocks.0.moe.down.w_q",
        "blocks.0.moe.down.scales",   "blocks.0.moe.down.zeros"};
    for (size_t i = 0; i < sizeof banks / sizeof banks[0]; i++)
        edit_grow_experts(e, banks[i], 9);
    edit_meta(e, "experts", "9");
    m = edit_expect_ok(e, "E = 9", &path);
    ck_assert_int_eq(hd_model_experts(m), 9);
    one_step(m, got);
    ck_assert(tu_all_finite_bf16(got, D));
    hd_model_free(m);
    tu_remove(path);
    edit_free(e);
}
END_TEST

START_TEST(test_missing_tensor)
{
    static const char *const drop[] = {
        "blocks.0.attn.o_proj.zeros", "blocks.0.moe_norm",
        "blocks.0.attn.kv_a.w_q", "blocks.0.moe.s_down.scales",
        "blocks.0.moe.up.w_q"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) {
        edit *e = edit_open(g_mbase);
        edit_drop(e, drop[i]);
        char what[128];
        snprintf(what, sizeof what, "missing %s", drop[i]);
        edit_expect(e, HD_ERR_MODEL, drop[i], what);
        edit_free(e);
    }
    /* The router missing: E cannot come from it. */
    edit *e = edit_open(g_mbase);
    edit_drop(e, "blocks.0.moe.router.weight");
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.router.weight",
                "missing router");
    edit_free(e);
    /* A KDA tensor missing. */
    e = edit_open(g_kbase);
    edit_drop(e, "blocks.0.attn.conv_w");
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.conv_w", "missing conv_w");
    edit_free(e);
}
END_TEST

START_TEST(test_extra_tensor)
{
    const uint64_t four[1] = {4}, hidden[1] = {D};
    edit *e = edit_open(g_mbase);
    edit_add(e, "blocks.0.attn.bogus", HD_DT_BF16, 1, four);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.bogus", "extra blocks.0.attn.bogus");
    edit_free(e);

    e = edit_open(g_mbase);
    edit_add(e, "lm_head.weight", HD_DT_BF16, 1, four);
    edit_expect(e, HD_ERR_MODEL, "lm_head.weight", "extra lm_head.weight");
    edit_free(e);

    /* A block far beyond the others: layers 1..8 would be missing. */
    e = edit_open(g_mbase);
    edit_add(e, "blocks.9.attn_norm", HD_DT_BF16, 1, hidden);
    edit_expect(e, HD_ERR_MODEL, "blocks.9|blocks.1", "extra blocks.9.attn_norm");
    edit_free(e);

    /* A KDA tensor in an MLA layer. */
    e = edit_open(g_mbase);
    const uint64_t conv[3] = {3, 4096, 4};
    edit_add(e, "blocks.0.attn.conv_w", HD_DT_BF16, 3, conv);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.conv_w",
                "extra conv_w in an MLA layer");
    edit_free(e);
}
END_TEST

START_TEST(test_wrong_dtype)
{
    /* BF16 written as U8 with a doubled last dimension: same bytes. */
    static const char *const bf16s[] = {"blocks.0.attn_norm",
                                        "blocks.0.moe.router.weight",
                                        "blocks.0.attn.q_proj.scales",
                                        "blocks.0.moe.down.zeros"};
    for (size_t i = 0; i < sizeof bf16s / sizeof bf16s[0]; i++) {
        edit *e = edit_open(g_mbase);
        hd_st_out *o = edit_find(e, bf16s[i]);
        ck_assert_int_eq(o->dtype, HD_DT_BF16);
        o->dtype = HD_DT_U8;
        o->shape[o->ndim - 1] *= 2;
        char what[128];
        snprintf(what, sizeof what, "%s as U8", bf16s[i]);
        edit_expect(e, HD_ERR_MODEL, bf16s[i], what);
        edit_free(e);
    }
    /* U8 written as BF16 with a halved last dimension. */
    edit *e = edit_open(g_mbase);
    hd_st_out *o = edit_find(e, "blocks.0.attn.q_proj.w_q");
    ck_assert_int_eq(o->dtype, HD_DT_U8);
    o->dtype = HD_DT_BF16;
    o->shape[o->ndim - 1] /= 2;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.q_proj.w_q", "w_q as BF16");
    edit_free(e);

    e = edit_open(g_kbase);
    o = edit_find(e, "blocks.0.attn.conv_w");
    o->dtype = HD_DT_U8;
    o->shape[2] *= 2;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.conv_w", "conv_w as U8");
    edit_free(e);
}
END_TEST

START_TEST(test_wrong_shape)
{
    /* w_q flattened: the same bytes in one dimension (KDA q_proj). */
    edit *e = edit_open(g_kbase);
    hd_st_out *o = edit_find(e, "blocks.0.attn.q_proj.w_q");
    ck_assert_int_eq(o->ndim, 2);
    ck_assert_uint_eq(o->shape[0], 1152);
    ck_assert_uint_eq(o->shape[1], 4096);
    o->ndim = 1;
    o->shape[0] = 1152u * 4096u;
    o->shape[1] = 0;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.q_proj.w_q", "w_q flattened");
    edit_free(e);

    /* w_q transposed: same bytes, [N, K/2]. */
    e = edit_open(g_mbase);
    o = edit_find(e, "blocks.0.attn.q_proj.w_q");
    uint64_t t = o->shape[0];
    o->shape[0] = o->shape[1];
    o->shape[1] = t;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.q_proj.w_q", "w_q transposed");
    edit_free(e);

    /* N changed on one tensor of a linear (data shortened to match). */
    e = edit_open(g_mbase);
    o = edit_find(e, "blocks.0.attn.o_proj.scales");
    o->shape[1] = 2300;
    o->bytes = o->shape[0] * 2300 * 2;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.o_proj.scales",
                "o_proj.scales N 2300");
    edit_free(e);

    /* N changed consistently on all three tensors of a linear. */
    e = edit_open(g_mbase);
    static const char *const parts[] = {"blocks.0.attn.o_proj.w_q",
                                        "blocks.0.attn.o_proj.scales",
                                        "blocks.0.attn.o_proj.zeros"};
    for (int i = 0; i < 3; i++) {
        o = edit_find(e, parts[i]);
        o->shape[1] = 2300;
        o->bytes = o->shape[0] * 2300 * (o->dtype == HD_DT_BF16 ? 2 : 1);
    }
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.o_proj", "o_proj N 2300");
    edit_free(e);

    /* A norm one element short. */
    e = edit_open(g_mbase);
    o = edit_find(e, "blocks.0.attn_norm");
    o->shape[0] = D - 1;
    o->bytes = (D - 1) * 2;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn_norm", "attn_norm [2303]");
    edit_free(e);

    /* KDA conv_w with its dimensions permuted (same bytes). */
    e = edit_open(g_kbase);
    o = edit_find(e, "blocks.0.attn.conv_w");
    o->shape[0] = 4096;
    o->shape[1] = 3;
    edit_expect(e, HD_ERR_MODEL, "blocks.0.attn.conv_w", "conv_w [4096,3,4]");
    edit_free(e);

    /* Two shared experts instead of one. */
    e = edit_open(g_mbase);
    edit_grow_experts(e, "blocks.0.moe.s_gate.w_q", 2);
    edit_grow_experts(e, "blocks.0.moe.s_gate.scales", 2);
    edit_grow_experts(e, "blocks.0.moe.s_gate.zeros", 2);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.s_gate", "two shared experts");
    edit_free(e);
}
END_TEST

static const char *const moe_banks[] = {
    "blocks.0.moe.router.weight", "blocks.0.moe.gate.w_q",
    "blocks.0.moe.gate.scales",   "blocks.0.moe.gate.zeros",
    "blocks.0.moe.up.w_q",        "blocks.0.moe.up.scales",
    "blocks.0.moe.up.zeros",      "blocks.0.moe.down.w_q",
    "blocks.0.moe.down.scales",   "blocks.0.moe.down.zeros"};

START_TEST(test_experts_inconsistent)
{
    /* Router of 8, gate bank of 9 (all three tensors). */
    edit *e = edit_open(g_mbase);
    edit_grow_experts(e, "blocks.0.moe.gate.w_q", 9);
    edit_grow_experts(e, "blocks.0.moe.gate.scales", 9);
    edit_grow_experts(e, "blocks.0.moe.gate.zeros", 9);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.gate|blocks.0.moe.router",
                "gate bank of 9, router of 8");
    edit_free(e);

    /* Only gate.w_q of 9. */
    e = edit_open(g_mbase);
    edit_grow_experts(e, "blocks.0.moe.gate.w_q", 9);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.gate.w_q",
                "gate.w_q of 9, rest of 8");
    edit_free(e);

    /* Router of 9, banks of 8. */
    e = edit_open(g_mbase);
    edit_grow_experts(e, "blocks.0.moe.router.weight", 9);
    edit_meta(e, "experts", NULL);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.",
                "router of 9, banks of 8");
    edit_free(e);

    /* Down bank of 7, others of 8. */
    e = edit_open(g_mbase);
    edit_slice_experts(e, "blocks.0.moe.down.w_q", 7);
    edit_slice_experts(e, "blocks.0.moe.down.scales", 7);
    edit_slice_experts(e, "blocks.0.moe.down.zeros", 7);
    edit_expect(e, HD_ERR_MODEL, "blocks.0.moe.down", "down bank of 7");
    edit_free(e);
}
END_TEST

START_TEST(test_too_few_experts)
{
    /* Every MoE tensor sliced to 7: consistent, but fewer than top-8. */
    edit *e = edit_open(g_mbase);
    for (size_t i = 0; i < sizeof moe_banks / sizeof moe_banks[0]; i++)
        edit_slice_experts(e, moe_banks[i], 7);
    edit_meta(e, "experts", "7");
    edit_expect(e, HD_ERR_MODEL, NULL, "7 experts (metadata 7)");
    edit_meta(e, "experts", NULL);
    edit_expect(e, HD_ERR_MODEL, NULL, "7 experts (no metadata)");
    edit_free(e);
}
END_TEST

START_TEST(test_metadata_mismatch)
{
    static const struct {
        const char *key, *value, *needles;
    } cases[] = {
        {"experts", "9", "experts"},      {"experts", "16", "experts"},
        {"experts", "abc", "experts"},    {"experts", "", "experts"},
        {"experts", "08x", "experts"},    {"pattern", "KKKM", "pattern"},
        {"pattern", "K", "pattern"},      {"pattern", "MM", "pattern"},
        {"pattern", "", "pattern"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        edit *e = edit_open(g_mbase);
        edit_meta(e, cases[i].key, cases[i].value);
        char what[128];
        snprintf(what, sizeof what, "metadata %s=\"%s\"", cases[i].key,
                 cases[i].value);
        edit_expect(e, HD_ERR_MODEL, cases[i].needles, what);
        edit_free(e);
    }
}
END_TEST

/* ---- byte-level damage ------------------------------------------------------ */

static void write_and_expect(const void *data, size_t bytes, hd_status want,
                             const char *what)
{
    char *path = tu_temp_path("raw");
    tu_write_file(path, data, bytes);
    expect_load_fails(path, want, NULL, what);
    tu_remove(path);
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

START_TEST(test_byte_level)
{
    size_t n = 0;
    unsigned char *file = tu_read_file(g_mbase, &n);
    ck_assert_uint_gt(n, 16);

    write_and_expect(file, n - 1, HD_ERR_FORMAT, "truncated by one byte");

    unsigned char *longer = tu_xmalloc(n + 1);
    memcpy(longer, file, n);
    longer[n] = 0;
    write_and_expect(longer, n + 1, HD_ERR_FORMAT, "one byte appended");
    free(longer);

    /* Header length fields beyond the file. */
    unsigned char saved[8];
    memcpy(saved, file, 8);
    put_le64(file, (uint64_t)n);
    write_and_expect(file, n, HD_ERR_FORMAT, "header length = file size");
    put_le64(file, (uint64_t)1 << 62);
    write_and_expect(file, n, HD_ERR_FORMAT, "header length 2^62");
    put_le64(file, UINT64_MAX);
    write_and_expect(file, n, HD_ERR_FORMAT, "header length 2^64-1");
    memcpy(file, saved, 8);

    /* The header cut short of its closing brace. */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | file[i];
    ck_assert_uint_lt(hlen + 8, n);
    write_and_expect(file, (size_t)hlen + 7, HD_ERR_FORMAT,
                     "cut inside the header");
    write_and_expect(file, 7, HD_ERR_FORMAT, "7 bytes");
    write_and_expect(file, (size_t)hlen + 8, HD_ERR_FORMAT, "header only");

    write_and_expect("", 0, HD_ERR_FORMAT, "0 bytes");

    /* Small hand-made headers. */
    static const char *const headers[] = {"{", "[]", "{}x", "\"x\"",
                                          "{\"a\":1}"};
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        unsigned char buf[64];
        size_t hl = strlen(headers[i]);
        put_le64(buf, hl);
        memcpy(buf + 8, headers[i], hl);
        char what[64];
        snprintf(what, sizeof what, "header '%s'", headers[i]);
        write_and_expect(buf, 8 + hl, HD_ERR_FORMAT, what);
    }
    /* An empty but valid safetensors file is not a model. */
    {
        unsigned char buf[16];
        put_le64(buf, 2);
        memcpy(buf + 8, "{}", 2);
        write_and_expect(buf, 10, HD_ERR_MODEL, "no tensors at all");
    }
    free(file);

    /* Paths that are not files. */
    char *dir = tu_temp_dir("dir");
    expect_load_fails(dir, HD_ERR_IO, NULL, "a directory");
    tu_remove_dir(dir);
    expect_load_fails("hdtest-no-such-file.safetensors", HD_ERR_IO, NULL,
                      "a missing path");
    expect_load_fails("hdtest-no-such-dir/x.safetensors", HD_ERR_IO, NULL,
                      "a missing folder");
}
END_TEST

/* The value of `key` ("RssFile", "RssAnon") in /proc/self/status, kB;
 * -1 where there is none (not Linux). */
static long proc_status_kb(const char *key)
{
    char line[256];
    const size_t n = strlen(key);
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            kb = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* Whether the files at a and b hold the same bytes. */
static int same_file_bytes(const char *a, const char *b)
{
    static unsigned char ba[1 << 16], bb[1 << 16];
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        if (na != nb || memcmp(ba, bb, na) != 0)
            same = 0;
        if (na < sizeof ba)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* m, just made from g_model's seed or file on the CPU backend (st its
 * status) when /proc/self/status gave `before` kB of `key`: at most
 * limit_num / limit_den of its weight bytes more are resident in `key`
 * (where the kernel tells), and saved again it is g_path byte for byte. */
static void check_held_once(const char *what, hd_model *m, hd_status st, const char *err,
                            const char *key, long before, int limit_num, int limit_den)
{
    long after;
    if (st == HD_ERR_BACKEND_UNAVAILABLE) {
        fprintf(stderr, "%s: no cpu backend here (%s)\n", what, err);
        return;
    }
    ck_assert_msg(st == HD_OK, "%s: the cpu model = %d (%s): %s", what, (int)st,
                  hd_status_string(st), err);
    after = proc_status_kb(key);
    if (before >= 0 && after >= 0) {
        const uint64_t w = hd_model_weight_bytes(m);
        ck_assert_msg((uint64_t)(after > before ? after - before : 0) * 1024 * (uint64_t)limit_den <
                          w * (uint64_t)limit_num,
                      "%s: %s %ld kB after %llu bytes of weights on the cpu backend "
                      "(%ld kB before)",
                      what, key, after, (unsigned long long)w, before);
    } else {
        fprintf(stderr, "%s: no %s in /proc/self/status; residency not checked\n", what, key);
    }
    {
        char *path = save_temp(m, "again");
        ck_assert_msg(same_file_bytes(g_path, path),
                      "%s: the model saved again differs from the reference's file", what);
        tu_remove(path);    /* frees the name too */
    }
    hd_model_free(m);
}

static void cpu_options(hd_options *opt)
{
    hd_options_init(opt);
    opt->backend = HD_BACKEND_CPU;
    opt->threads = 1;
}

/* The CPU backend repacks the int4 matrices into its own layout, then
 * gives the originals back (the issue: memory is the packed weights
 * once).  From a file (g_path): less than a quarter of the int4 bytes
 * stay resident as file pages (without the release: all of them), and
 * the given-back pages are read again where something touches them. */
START_TEST(test_cpu_releases_file_pages)
{
    hd_options opt;
    hd_model *m = NULL;
    char err[512] = "";
    const long before = proc_status_kb("RssFile");
    hd_status st;

    cpu_options(&opt);
    st = hd_model_load(g_path, &opt, &m, err, sizeof err);
    check_held_once("file", m, st, err, "RssFile", before, 1, 4);
}
END_TEST

/* Synthetic (g_model's seed, E and pattern): the int4 tensors are the
 * process's own memory, given back and made again from the seed when the
 * model is saved; less than 1.5 x the weights' bytes more anonymous
 * memory resident (twice without the release). */
START_TEST(test_cpu_releases_synth_pages)
{
    hd_options opt;
    hd_model *m = NULL;
    char err[512] = "";
    const long before = proc_status_kb("RssAnon");
    hd_status st;

    cpu_options(&opt);
    st = hd_model_synth(3, 8, "KKKM", &opt, &m, err, sizeof err);
    check_held_once("synth", m, st, err, "RssAnon", before, 3, 2);
}
END_TEST

/* The peak of resident memory since it was last reset, in kB (VmHWM;
 * writing 5 to clear_refs resets it to the current RSS, Linux 4.0 on), or
 * -1 where the kernel cannot reset or tell it. */
static long reset_peak_kb(void)
{
    FILE *f;
#if defined(HAVE_MALLOC_TRIM) && defined(HAVE_MALLOC_H)
    /* the free pages of earlier tests' models back to the kernel, so that
     * the new model's allocations count (reused, they would not) */
    (void)malloc_trim(0);
#endif
    f = fopen("/proc/self/clear_refs", "w");
    int ok = f && fputs("5", f) >= 0;
    if (f && fclose(f) != 0)
        ok = 0;
    return ok ? proc_status_kb("VmHWM") : -1;
}

/* A synthetic model's int4 matrices are made a layer at a time as the
 * CPU backend repacks them, each layer's given back before the next one
 * is made: while the model is made, the resident memory never grows by
 * more than 1.5 x its weights (the copies, one layer's originals and
 * small things; making every original first, as before, took it to 2 x).
 * Under valgrind, whose own memory grows with the program's, the peak is
 * not checked. */
START_TEST(test_cpu_synth_peak)
{
    hd_options opt;
    hd_model *m = NULL;
    char err[512] = "";
    const long before = reset_peak_kb();
    long after;
    hd_status st;

    cpu_options(&opt);
    st = hd_model_synth(3, 8, "KKKM", &opt, &m, err, sizeof err);
    if (st == HD_ERR_BACKEND_UNAVAILABLE) {
        fprintf(stderr, "peak: no cpu backend here (%s)\n", err);
        return;
    }
    ck_assert_msg(st == HD_OK, "the cpu model = %d (%s): %s", (int)st, hd_status_string(st),
                  err);
    after = proc_status_kb("VmHWM");
    if (before < 0 || after < 0)
        fprintf(stderr, "peak: VmHWM cannot be reset or read here; not checked\n");
    else if (tu_under_valgrind())
        fprintf(stderr, "peak: under valgrind; not checked\n");
    else
        ck_assert_msg((uint64_t)(after > before ? after - before : 0) * 1024 * 2 <
                          hd_model_weight_bytes(m) * 3,
                      "peak: VmHWM %ld kB after making %llu bytes of weights on the cpu "
                      "backend (%ld kB before)",
                      after, (unsigned long long)hd_model_weight_bytes(m), before);
    hd_model_free(m);
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");

    TCase *tc = tcase_create("save-load");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_unchecked_fixture(tc, saved_setup, saved_teardown);
    tcase_add_test(tc, test_save_load_identical);
    tcase_add_test(tc, test_saved_file_layout);
    tcase_add_test(tc, test_saved_synth_values);
    tcase_add_test(tc, test_cpu_releases_file_pages);
    tcase_add_test(tc, test_cpu_releases_synth_pages);
    tcase_add_test(tc, test_cpu_synth_peak);
    suite_add_tcase(s, tc);

    tc = tcase_create("save");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_synth_rules_self_check);
    tcase_add_test(tc, test_save_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("malformed");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_unchecked_fixture(tc, malformed_setup, malformed_teardown);
    tcase_add_test(tc, test_rewrite_controls);
    tcase_add_test(tc, test_missing_tensor);
    tcase_add_test(tc, test_extra_tensor);
    tcase_add_test(tc, test_wrong_dtype);
    tcase_add_test(tc, test_wrong_shape);
    tcase_add_test(tc, test_experts_inconsistent);
    tcase_add_test(tc, test_too_few_experts);
    tcase_add_test(tc, test_metadata_mismatch);
    tcase_add_test(tc, test_byte_level);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(model_suite());
}
