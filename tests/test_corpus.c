/* test_corpus.c - hostile weight files, replayed.
 *
 * 1. The corpus of tests/data/malformed: every file listed in its MANIFEST
 *    goes through the raw parser (hd_st_open, and hd_st_parse on the bytes)
 *    and through hd_model_load; each call must give the listed status, a
 *    message holding the listed word, a NULL model, and finish in bounded
 *    time.  A file in the folder that the MANIFEST does not list fails.
 * 2. A generator of model-level failures: a model of pattern "M", E 8 takes
 *    about 49 MB, too much to commit, so each variant is written at test
 *    time as its header followed by a sparse hole for the data (ftruncate;
 *    loading validates the header and never reads the weights).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "motif.h"
#include "safetensors.h"
#include "testutil.h"

/* Bounded time: generous for valgrind and sanitizers, far below a hang. */
#define MAX_SECONDS_NATIVE 2.0
#define MAX_SECONDS_SLOW 60.0

static double max_seconds(void)
{
    /* Valgrind and ASan slow everything down 20-50x. */
    return getenv("HD_TEST_SLOW") ? MAX_SECONDS_SLOW : MAX_SECONDS_NATIVE;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool status_parse(const char *s, hd_status *st)
{
    static const struct { const char *name; hd_status st; } names[] = {
        {"OK", HD_OK},         {"IO", HD_ERR_IO},
        {"FORMAT", HD_ERR_FORMAT}, {"MODEL", HD_ERR_MODEL},
        {"OUT_OF_MEMORY", HD_ERR_OUT_OF_MEMORY},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *st = names[i].st;
            return true;
        }
    return false;
}

/* ---- the manifest ----------------------------------------------------------- */

#define MAX_ENTRIES 256

typedef struct entry {
    char file[128];
    hd_status st_status, model_status;
    char word[128];
} entry;

static entry g_entries[MAX_ENTRIES];
static size_t g_n_entries;
static char g_dir[600];

static void manifest_load(void)
{
    const char *data = getenv("HD_TEST_DATA");
    ck_assert_msg(data != NULL, "HD_TEST_DATA is not set");
    ck_assert_msg(strlen(data) < 500, "HD_TEST_DATA is too long");
    snprintf(g_dir, sizeof g_dir, "%s/malformed", data);
    char path[700];
    snprintf(path, sizeof path, "%s/MANIFEST", g_dir);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[512];
    g_n_entries = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        ck_assert_uint_lt(g_n_entries, MAX_ENTRIES);
        entry *e = &g_entries[g_n_entries];
        char s1[32], s2[32];
        line[strcspn(line, "\n")] = 0;
        ck_assert_msg(sscanf(line, "%127s %31s %31s %127[^\n]", e->file, s1,
                             s2, e->word) == 4,
                      "MANIFEST: bad line '%s'", line);
        ck_assert_msg(status_parse(s1, &e->st_status) &&
                          status_parse(s2, &e->model_status),
                      "MANIFEST: bad status in '%s'", line);
        g_n_entries++;
    }
    fclose(f);
    ck_assert_uint_gt(g_n_entries, 40);
}

START_TEST(test_manifest_complete)
{
    manifest_load();
    DIR *d = opendir(g_dir);
    ck_assert_msg(d != NULL, "cannot open %s", g_dir);
    struct dirent *de;
    size_t files = 0;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (n[0] == '.' || strcmp(n, "MANIFEST") == 0 ||
            strcmp(n, "make-corpus.py") == 0)
            continue;
        bool listed = false;
        for (size_t i = 0; i < g_n_entries && !listed; i++)
            listed = strcmp(g_entries[i].file, n) == 0;
        ck_assert_msg(listed, "%s/%s is not listed in MANIFEST", g_dir, n);
        files++;
    }
    closedir(d);
    ck_assert_msg(files == g_n_entries,
                  "MANIFEST lists %zu files, the folder holds %zu",
                  g_n_entries, files);
}
END_TEST

static void check_result(const char *what, const char *file, hd_status got,
                         hd_status want, const char *err, const char *word,
                         double seconds)
{
    ck_assert_msg(got == want, "%s(%s) = %d (%s), expected %d (%s): '%s'",
                  what, file, (int)got, hd_status_string(got), (int)want,
                  hd_status_string(want), err);
    if (want != HD_OK) {
        ck_assert_msg(err[0] != '\0', "%s(%s): no message", what, file);
        ck_assert_msg(strchr(err, '\n') == NULL,
                      "%s(%s): message is not one line", what, file);
        ck_assert_msg(strstr(err, word) != NULL,
                      "%s(%s): message '%s' does not contain '%s'", what,
                      file, err, word);
    }
    ck_assert_msg(seconds < max_seconds(), "%s(%s) took %.2f s", what, file,
                  seconds);
}

START_TEST(test_replay)
{
    manifest_load();
    hd_options opt;
    tu_options_ref(&opt);
    for (size_t i = 0; i < g_n_entries; i++) {
        const entry *e = &g_entries[i];
        char path[800], err[512];
        snprintf(path, sizeof path, "%s/%.127s", g_dir, e->file);

        /* The raw parser, through the file system. */
        hd_st_file f;
        memset(err, 0, sizeof err);
        double t0 = now_s();
        hd_status st = hd_st_open(path, &f, err, sizeof err);
        check_result("hd_st_open", e->file, st, e->st_status, err, e->word,
                     now_s() - t0);
        if (st == HD_OK)
            hd_st_close(&f);

        /* The raw parser on the bytes in memory, in an exact-size buffer
         * so that ASan and valgrind see any read past the end. */
        size_t n = 0;
        void *bytes = tu_read_file(path, &n);
        unsigned char *exact = tu_xmalloc(n ? n : 1);
        if (n)
            memcpy(exact, bytes, n);
        free(bytes);
        memset(err, 0, sizeof err);
        t0 = now_s();
        st = hd_st_parse(n ? exact : NULL, n, &f, err, sizeof err);
        check_result("hd_st_parse", e->file, st, e->st_status, err, e->word,
                     now_s() - t0);
        if (st == HD_OK)
            hd_st_close(&f);
        free(exact);

        /* The whole loader. */
        hd_model *m = (hd_model *)err; /* must become NULL */
        memset(err, 0, sizeof err);
        t0 = now_s();
        st = hd_model_load(path, &opt, &m, err, sizeof err);
        double dt = now_s() - t0;
        if (st == HD_OK)
            hd_model_free(m);
        check_result("hd_model_load", e->file, st, e->model_status, err,
                     e->word, dt);
        ck_assert_msg(m == NULL, "hd_model_load(%s): model not NULL", e->file);
        printf("%-32s %-7s %-7s %s\n", e->file, hd_status_string(e->st_status),
               hd_status_string(st), err);
    }
}
END_TEST

/* ---- the model-level generator --------------------------------------------- */

#define MAX_GEN 64

typedef struct gen_tensor {
    char name[96];
    const char *dtype; /* "U8", "BF16", "F32", ... */
    int ndim;
    uint64_t shape[4];
} gen_tensor;

typedef struct gen {
    gen_tensor t[MAX_GEN];
    size_t n;
    char meta_pattern[80], meta_experts[32]; /* "" = absent */
} gen;

static unsigned dtype_bytes(const char *dtype)
{
    if (strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0)
        return 4;
    if (strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0)
        return 2;
    return 1; /* U8, I8 */
}

/* The tensors of a model of `pattern` with E experts, from the motif table
 * (the same table the loader checks against). */
static void gen_layout(gen *g, const char *pattern, int experts)
{
    hd_model *m = tu_xcalloc(1, sizeof *m);
    snprintf(m->pattern, sizeof m->pattern, "%s", pattern);
    m->experts = experts;
    size_t n = hd_motif_tensor_count(pattern);
    ck_assert_uint_le(n, MAX_GEN);
    hd_tensor_spec *specs = tu_xcalloc(n, sizeof *specs);
    hd_motif_layout(m, specs);
    memset(g, 0, sizeof *g);
    for (size_t i = 0; i < n; i++) {
        gen_tensor *t = &g->t[i];
        snprintf(t->name, sizeof t->name, "%s", specs[i].name);
        t->dtype = specs[i].dtype == HD_DT_BF16 ? "BF16" : "U8";
        t->ndim = specs[i].ndim;
        for (int d = 0; d < t->ndim; d++)
            t->shape[d] = specs[i].shape[d];
    }
    g->n = n;
    snprintf(g->meta_pattern, sizeof g->meta_pattern, "%s", pattern);
    snprintf(g->meta_experts, sizeof g->meta_experts, "%d", experts);
    free(specs);
    free(m);
}

static gen_tensor *gen_find(gen *g, const char *name)
{
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->t[i].name, name) == 0)
            return &g->t[i];
    ck_abort_msg("generator: no tensor %s", name);
    return NULL;
}

static void gen_drop(gen *g, const char *name)
{
    gen_tensor *t = gen_find(g, name);
    size_t i = (size_t)(t - g->t);
    memmove(t, t + 1, (g->n - i - 1) * sizeof *t);
    g->n--;
}

static gen_tensor *gen_add(gen *g, const char *name, const char *dtype,
                           int ndim, uint64_t d0, uint64_t d1, uint64_t d2)
{
    ck_assert_uint_lt(g->n, MAX_GEN);
    gen_tensor *t = &g->t[g->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    return t;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Writes the header; the data is a hole of the right size (plus `delta`
 * bytes: < 0 truncates, > 0 appends). */
static char *gen_write(const gen *g, int64_t delta)
{
    size_t cap = 16384, len = 0;
    char *h = tu_xmalloc(cap);
    uint64_t off = 0;
#define APPEND(...)                                                         \
    do {                                                                    \
        int k_ = snprintf(h + len, cap - len, __VA_ARGS__);                 \
        ck_assert(k_ >= 0 && (size_t)k_ < cap - len);                      \
        len += (size_t)k_;                                                  \
    } while (0)
    APPEND("{");
    if (g->meta_pattern[0] || g->meta_experts[0]) {
        APPEND("\"__metadata__\":{");
        if (g->meta_pattern[0])
            APPEND("\"pattern\":\"%s\"%s", g->meta_pattern,
                   g->meta_experts[0] ? "," : "");
        if (g->meta_experts[0])
            APPEND("\"experts\":\"%s\"", g->meta_experts);
        APPEND("},");
    }
    for (size_t i = 0; i < g->n; i++) {
        const gen_tensor *t = &g->t[i];
        uint64_t bytes = dtype_bytes(t->dtype);
        APPEND("%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
               t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            APPEND("%s%" PRIu64, d ? "," : "", t->shape[d]);
            bytes *= t->shape[d];
        }
        APPEND("],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
               off + bytes);
        off += bytes;
    }
    APPEND("}");
#undef APPEND
    while (len % 8)
        h[len++] = ' ';
    char *path = tu_temp_path("gen");
    int fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_msg(fd >= 0, "cannot open %s", path);
    unsigned char le[8];
    put_le64(le, len);
    ck_assert(write(fd, le, 8) == 8);
    ck_assert(write(fd, h, len) == (ssize_t)len);
    ck_assert(ftruncate(fd, (off_t)(8 + len + off + delta)) == 0);
    close(fd);
    free(h);
    return path;
}

/* Writes the variant, loads it through hd_st_open and hd_model_load. */
static void gen_expect(const gen *g, int64_t delta, hd_status want_st,
                       hd_status want_model, const char *word,
                       const char *what)
{
    char *path = gen_write(g, delta);
    char err[512] = "";
    hd_st_file f;
    double t0 = now_s();
    hd_status st = hd_st_open(path, &f, err, sizeof err);
    check_result("hd_st_open", what, st, want_st, err, word, now_s() - t0);
    if (st == HD_OK)
        hd_st_close(&f);

    hd_options opt;
    tu_options_ref(&opt);
    hd_model *m = (hd_model *)err;
    memset(err, 0, sizeof err);
    t0 = now_s();
    st = hd_model_load(path, &opt, &m, err, sizeof err);
    double dt = now_s() - t0;
    if (st == HD_OK) {
        hd_model_free(m);
        m = NULL;
    }
    check_result("hd_model_load", what, st, want_model, err, word, dt);
    ck_assert_msg(m == NULL, "%s: model not NULL", what);
    printf("%-40s -> %s: %s\n", what, hd_status_string(st), err);
    tu_remove(path);
}

#define BANK "blocks.0.moe."
#define ROUTER "blocks.0.moe.router.weight"

START_TEST(test_generated_models)
{
    gen g;
    const hd_status OK = HD_OK, F = HD_ERR_FORMAT, M = HD_ERR_MODEL;

    gen_layout(&g, "M", 8);
    gen_expect(&g, 0, OK, OK, "", "control: the generator's model loads");

    /* The data: truncated, trailing bytes. */
    gen_expect(&g, -1, F, F, "past the end", "data truncated by one byte");
    gen_expect(&g, -4096, F, F, "past the end", "data truncated by 4 KiB");
    gen_expect(&g, 1, F, F, "trailing", "one trailing byte");

    /* Each tensor of the motif missing in turn. */
    for (size_t i = 0; i < g.n; i++) {
        gen h;
        char what[160];
        gen_layout(&h, "M", 8);
        char name[96];
        snprintf(name, sizeof name, "%s", h.t[i].name);
        gen_drop(&h, name);
        snprintf(what, sizeof what, "missing %s", name);
        gen_expect(&h, 0, OK, M,
                   strcmp(name, "blocks.0.attn_norm") == 0 ? "attn_norm" : name,
                   what);
    }

    /* Extra tensors: of the other layer kind, of a layer that does not
     * exist, of no layer at all, and one the layer has under another dtype. */
    gen_layout(&g, "M", 8);
    gen_add(&g, "blocks.0.attn.beta_proj", "BF16", 2, 32, HD_HIDDEN, 0);
    gen_expect(&g, 0, OK, M, "blocks.0.attn.beta_proj",
               "a KDA tensor in an MLA layer");
    gen_layout(&g, "M", 8);
    gen_add(&g, "blocks.1.moe.router.weight", "BF16", 2, 8, HD_HIDDEN, 0);
    gen_expect(&g, 0, OK, M, "blocks.1.moe.router.weight",
               "a tensor of a layer that does not exist");
    gen_layout(&g, "M", 8);
    gen_add(&g, "lm_head.weight", "F32", 1, 16, 0, 0);
    gen_expect(&g, 0, OK, M, "lm_head.weight", "an unrelated F32 tensor");
    gen_layout(&g, "M", 8);
    gen_add(&g, "blocks.0.attn.g_proj.w_q", "U8", 2, 1152, 4096, 0);
    gen_expect(&g, 0, OK, M, "pattern K", "an MLA layer with a KDA g_proj");

    /* Wrong dtypes, each kind. */
    gen_layout(&g, "M", 8);
    gen_find(&g, "blocks.0.attn_norm")->dtype = "F16";
    gen_expect(&g, 0, OK, M, "blocks.0.attn_norm", "attn_norm F16");
    gen_layout(&g, "M", 8);
    gen_find(&g, BANK "gate.w_q")->dtype = "I8";
    gen_expect(&g, 0, OK, M, BANK "gate.w_q", "bank w_q I8");
    gen_layout(&g, "M", 8);
    gen_find(&g, ROUTER)->dtype = "F32";
    gen_expect(&g, 0, OK, M, ROUTER, "router F32");

    /* Shapes that are not the motif's: transposed, one more row, an extra
     * dimension, a scalar, a zero dimension. */
    gen_layout(&g, "M", 8);
    {
        gen_tensor *t = gen_find(&g, "blocks.0.attn.q_proj.w_q");
        uint64_t a = t->shape[0];
        t->shape[0] = t->shape[1];
        t->shape[1] = a;
        gen_expect(&g, 0, OK, M, "blocks.0.attn.q_proj.w_q", "q_proj transposed");
    }
    gen_layout(&g, "M", 8);
    gen_find(&g, "blocks.0.moe_norm")->shape[0] = HD_HIDDEN + 1;
    gen_expect(&g, 0, OK, M, "blocks.0.moe_norm", "moe_norm one longer");
    gen_layout(&g, "M", 8);
    {
        gen_tensor *t = gen_find(&g, "blocks.0.moe_norm");
        t->ndim = 2;
        t->shape[1] = 1;
        gen_expect(&g, 0, OK, M, "blocks.0.moe_norm", "moe_norm [2304, 1]");
    }
    gen_layout(&g, "M", 8);
    gen_find(&g, "blocks.0.attn_norm")->ndim = 0;
    gen_expect(&g, 0, OK, M, "attn_norm", "attn_norm a scalar");
    gen_layout(&g, "M", 8);
    gen_find(&g, BANK "up.scales")->shape[1] = 0;
    gen_expect(&g, 0, OK, M, BANK "up.scales", "bank scales with a 0 dimension");
    gen_layout(&g, "M", 8);
    gen_find(&g, ROUTER)->shape[1] = 2305;
    gen_expect(&g, 0, OK, M, ROUTER, "router [8, 2305]");

    /* Experts: inconsistent between router and banks, too few, too many. */
    gen_layout(&g, "M", 9);
    gen_find(&g, ROUTER)->shape[0] = 8;
    g.meta_experts[0] = 0;
    gen_expect(&g, 0, OK, M, BANK, "router 8 experts, banks 9");
    gen_layout(&g, "M", 8);
    gen_find(&g, ROUTER)->shape[0] = 9;
    g.meta_experts[0] = 0;
    gen_expect(&g, 0, OK, M, BANK, "router 9 experts, banks 8");
    gen_layout(&g, "M", 8);
    gen_find(&g, BANK "down.zeros")->shape[0] = 7;
    gen_expect(&g, 0, OK, M, BANK "down.zeros", "one bank of 7 experts");
    gen_layout(&g, "M", 7);
    gen_expect(&g, 0, OK, M, "experts", "7 experts everywhere");
    gen_layout(&g, "M", 8);
    gen_find(&g, ROUTER)->shape[0] = 0;
    gen_expect(&g, 0, OK, M, "experts", "router with 0 experts");
    gen_layout(&g, "M", 8);
    gen_find(&g, ROUTER)->shape[0] = HD_MAX_EXPERTS + 1;
    gen_expect(&g, 0, OK, M, "experts", "router with 65537 experts");

    /* Metadata that disagrees with the tensors. */
    gen_layout(&g, "M", 8);
    snprintf(g.meta_pattern, sizeof g.meta_pattern, "K");
    gen_expect(&g, 0, OK, M, "pattern", "__metadata__ pattern K");
    gen_layout(&g, "M", 8);
    snprintf(g.meta_experts, sizeof g.meta_experts, "8x");
    gen_expect(&g, 0, OK, M, "experts", "__metadata__ experts 8x");
    gen_layout(&g, "M", 8);
    snprintf(g.meta_experts, sizeof g.meta_experts, "99999999999999999999");
    gen_expect(&g, 0, OK, M, "experts", "__metadata__ experts too big");

    /* A second layer whose kind cannot be told; a layer gap. */
    gen_layout(&g, "M", 8);
    gen_add(&g, "blocks.1.attn_norm", "BF16", 1, HD_HIDDEN, 0, 0);
    gen_expect(&g, 0, OK, M, "layer 1", "layer 1 of no kind");
    gen_layout(&g, "M", 8);
    gen_add(&g, "blocks.2.attn_norm", "BF16", 1, HD_HIDDEN, 0, 0);
    gen_expect(&g, 0, OK, M, "blocks.2.attn_norm", "a gap in the layers");
}
END_TEST

static Suite *corpus_suite(void)
{
    Suite *s = suite_create("corpus");
    TCase *tc = tcase_create("files");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_manifest_complete);
    tcase_add_test(tc, test_replay);
    suite_add_tcase(s, tc);
    tc = tcase_create("generated");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_test(tc, test_generated_models);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(corpus_suite());
}
