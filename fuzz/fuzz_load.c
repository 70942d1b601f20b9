/* fuzz_load.c - libFuzzer target: bytes -> the safetensors parser -> the
 * model validation of hd_model_load (without the file system).
 *
 * Promises checked: the parser answers HD_OK, HD_ERR_FORMAT or
 * HD_ERR_OUT_OF_MEMORY with a one-line message; a parsed file's lookups
 * work for every tensor; validation answers HD_OK, HD_ERR_MODEL or
 * HD_ERR_OUT_OF_MEMORY and a failed one leaves the model NULL.  ASan and
 * UBSan (with --enable-fuzzers, or --enable-sanitizers for the replay)
 * catch every read outside the input. */
#include "config.h"

#include <string.h>

#include "fuzz.h"
#include "model.h"
#include "safetensors.h"

static void check_message(hd_status st, const char *err, size_t err_size)
{
    fuzz_check(memchr(err, 0, err_size) != NULL, "message not terminated");
    if (st != HD_OK) {
        fuzz_check(err[0] != 0, "status %d without a message", (int)st);
        fuzz_check(strchr(err, '\n') == NULL, "message is not one line: %s",
                   err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hd_st_file f;
    char err[256];
    hd_options opt;
    hd_model *model = NULL;

    memset(err, 0, sizeof err);
    hd_status st = hd_st_parse(data, size, &f, err, sizeof err);
    check_message(st, err, sizeof err);
    fuzz_check(st == HD_OK || st == HD_ERR_FORMAT ||
                   st == HD_ERR_OUT_OF_MEMORY,
               "hd_st_parse = %d: %s", (int)st, err);
    if (st != HD_OK)
        return 0;

    for (size_t i = 0; i < f.n_tensors; i++) {
        const hd_st_tensor *t = hd_st_find(&f, f.tensors[i].name);
        fuzz_check(t == &f.tensors[i], "hd_st_find(%s) lost it",
                   f.tensors[i].name);
        fuzz_check(t->end <= f.data_bytes && t->begin <= t->end,
                   "offsets out of the data");
        if (t->end > t->begin) { /* touch both ends: ASan checks them */
            volatile unsigned char first = t->data[0];
            volatile unsigned char last = t->data[t->end - t->begin - 1];
            (void)first;
            (void)last;
        }
    }
    for (size_t i = 0; i < f.n_meta; i++)
        fuzz_check(hd_st_meta_get(&f, f.meta[i].key) != NULL, "meta lost");

    hd_options_init(&opt);
    opt.backend = HD_BACKEND_REF;
    memset(err, 0, sizeof err);
    st = hd_model_from_st(&f, "fuzz", &opt, &model, err, sizeof err);
    check_message(st, err, sizeof err);
    fuzz_check(st == HD_OK || st == HD_ERR_MODEL ||
                   st == HD_ERR_OUT_OF_MEMORY,
               "hd_model_from_st = %d: %s", (int)st, err);
    fuzz_check((st == HD_OK) == (model != NULL), "model and status disagree");
    hd_model_free(model);
    return 0;
}
