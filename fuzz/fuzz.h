/* fuzz.h - what the fuzz targets share with their drivers.
 *
 * Each target defines LLVMFuzzerTestOneInput.  Built with --enable-fuzzers
 * it is linked with libFuzzer (-fsanitize=fuzzer); otherwise with replay.c,
 * whose main() feeds it every file of the seed corpus, so that 'make check'
 * replays the corpora (and the regressions found by fuzzing) in every build.
 *
 * A target reports a broken promise of the library (a status outside the
 * documented set, a state changed by a failed call) with fuzz_fail, which
 * prints and aborts: libFuzzer and the replay driver both report that.
 */
#ifndef HD_FUZZ_H
#define HD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define fuzz_check(cond, ...)                                               \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__,          \
                    __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            abort();                                                        \
        }                                                                   \
    } while (0)

#endif /* HD_FUZZ_H */
