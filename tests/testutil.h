/* testutil.h - helpers shared by the Check suites of libhd.
 *
 * Everything that can fail here fails the current test (ck_abort_msg) with a
 * message that says what went wrong, so tests can call the helpers without
 * checking results.
 *
 * Temporary files: tu_temp_path() and tu_temp_dir() create names in the
 * current directory ("hdtest-<pid>-<tag>-XXXXXX", pid being the process that
 * called tu_run_suite).  tu_run_suite() removes whatever is left with that
 * prefix after the suite ran, so a test that fails half-way (Check ends the
 * forked child at once) does not leave files behind.
 */
#ifndef HD_TESTUTIL_H
#define HD_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hd.h"

/* Per-test timeout in seconds: the reference backend is slow scalar C. */
#define TU_TIMEOUT 600

/* Number of state tensor kinds (HD_STATE_S .. HD_STATE_K_ROPE). */
#define TU_N_STATE_TENSORS 6

/* ---- memory -------------------------------------------------------------- */

/* malloc / calloc that fail the test instead of returning NULL. */
void *tu_xmalloc(size_t bytes);
void *tu_xcalloc(size_t count, size_t size);

/* ---- test data ------------------------------------------------------------ */

/* Reads $HD_TEST_DATA/<relpath> into a malloc'd buffer; *bytes gets its size
 * (bytes may be NULL).  Fails the test when HD_TEST_DATA is unset or the file
 * is missing or unreadable. */
void *tu_load_data(const char *relpath, size_t *bytes);

/* As tu_load_data, and fails the test unless the file has exactly
 * expect_bytes bytes. */
void *tu_load_data_sized(const char *relpath, size_t expect_bytes);

/* In place: little-endian file words -> host order (no-op on little-endian
 * hosts). */
void tu_le16_to_host(uint16_t *p, size_t n);
void tu_le32_to_host(uint32_t *p, size_t n);

/* ---- numbers -------------------------------------------------------------- */

/* bf16 bit pattern -> float (exact). */
float tu_bf16_to_f32(uint16_t bits);

/* Relative L2 error |a - b|_2 / |b|_2, accumulated in double; |a|_2 when
 * |b|_2 == 0.  NaN anywhere gives NaN (so a tolerance check fails). */
double tu_rel_l2_f32(const float *a, const float *b, size_t n);
double tu_rel_l2_bf16(const uint16_t *a, const uint16_t *b, size_t n);

/* Whether every value is finite (no NaN, no infinity). */
bool tu_all_finite_f32(const float *p, size_t n);
bool tu_all_finite_bf16(const uint16_t *p, size_t n);

/* ---- temporary files ------------------------------------------------------ */

/* A new, empty file in the current directory (made with mkstemp); returns
 * its malloc'd path.  Remove it with tu_remove. */
char *tu_temp_path(const char *tag);
/* A new, empty directory in the current directory (mkdtemp); remove it with
 * tu_remove_dir. */
char *tu_temp_dir(const char *tag);
/* Unlinks the file (and "<path>.tmp.*" is the library's business) and frees
 * the path; NULL is fine. */
void tu_remove(char *path);
void tu_remove_dir(char *path);

/* Writes bytes to path (replacing it); fails the test on error. */
void tu_write_file(const char *path, const void *data, size_t bytes);
/* Reads a whole file into a malloc'd buffer; fails the test on error. */
void *tu_read_file(const char *path, size_t *bytes);

/* ---- models, states, steps ------------------------------------------------ */

/* Options with backend = HD_BACKEND_REF (everything else default). */
void tu_options_ref(hd_options *options);

/* hd_model_synth on the reference backend; asserts HD_OK and a non-NULL
 * model. */
hd_model *tu_synth_ref(uint32_t seed, int experts, const char *pattern);

/* hd_state_new; asserts HD_OK. */
hd_state *tu_state_new(const hd_model *model, size_t capacity);

/* hd_synth_input; asserts HD_OK. */
void tu_input(uint32_t seed, uint64_t step, uint16_t *out_bf16);

/* hd_step with an assertion of HD_OK that names the step. */
void tu_step(const hd_model *model, hd_state *state, const uint16_t *in,
             uint16_t *out);

/* Number of 'M' layers of the model. */
int tu_n_mla(const hd_model *model);

/* ---- state snapshots ------------------------------------------------------ */

/* Every tensor of every layer of a state, exported (the layer kinds come
 * from hd_model_pattern), plus the context length. */
typedef struct tu_snapshot {
    int n_layers;
    char pattern[HD_MAX_LAYERS + 1];
    size_t context;
    void *data[HD_MAX_LAYERS][TU_N_STATE_TENSORS];
    size_t bytes[HD_MAX_LAYERS][TU_N_STATE_TENSORS];
} tu_snapshot;

/* Whether layer kind `kind` ('K' or 'M') has tensor `which`. */
bool tu_layer_has(char kind, hd_state_tensor which);

/* Exports everything (asserting HD_OK and the sizes). */
tu_snapshot *tu_snapshot_take(const hd_model *model, const hd_state *state);
/* Whether two snapshots are equal byte for byte (context included). */
bool tu_snapshot_equal(const tu_snapshot *a, const tu_snapshot *b);
/* Puts a snapshot back into a state: hd_state_prefill with the MLA caches,
 * then hd_state_import of every tensor (asserting HD_OK). */
void tu_snapshot_restore(hd_state *state, const tu_snapshot *snap);
void tu_snapshot_free(tu_snapshot *snap);

/* ---- test size ---------------------------------------------------------------- */

/* Whether the suites run at their small size: fewer steps, contexts,
 * experts and repetitions, every code path still executed (every backend,
 * instruction-set path, layer kind and error path).  HD_TEST_SCALE=small or
 * HD_TEST_SCALE=full decides; unset or empty, a run under valgrind is small
 * (when configure found valgrind/valgrind.h) and any other run is full.
 * tests/valgrind-all.sh sets small: memcheck is ~30x slower than native.
 * What a test checks is the same at both sizes; only how much it runs
 * changes.  Any other value fails tu_run_suite. */
bool tu_small(void);

/* Whether the test runs under valgrind (where configure found
 * valgrind/valgrind.h; false elsewhere). */
bool tu_under_valgrind(void);

/* `full` at the full size, `small` at the small size. */
int tu_size(int full, int small);

/* ---- running ---------------------------------------------------------------- */

/* Runs the suite (CK_NORMAL output) after printing the test size, removes
 * leftover temporary files, frees the runner, and returns EXIT_SUCCESS iff
 * no test failed. */
int tu_run_suite(Suite *suite);

#endif /* HD_TESTUTIL_H */
