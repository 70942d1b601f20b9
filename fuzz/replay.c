/* replay.c - runs a fuzz target without libFuzzer: every file named on the
 * command line (a folder: every file in it) is passed to
 * LLVMFuzzerTestOneInput once.  With no arguments it replays
 * $HD_FUZZ_CORPUS/<target> (what 'make check' does).  Exit status 0 when
 * every input ran; a broken promise aborts inside the target. */
#include "config.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL, *exact;
    size_t n = 0, cap = 0;

    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    for (;;) {
        if (n == cap) {
            unsigned char *p = realloc(buf, cap = cap ? 2 * cap : 4096);
            if (!p) {
                fclose(f);
                free(buf);
                return 1;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (got == 0)
            break;
        n += got;
    }
    fclose(f);
    /* An exact-size copy, like libFuzzer's, so a read past the end is seen
     * by ASan and valgrind. */
    exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    if (n)
        memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of a folder, in name order; returns the count run. */
static int run_path(const char *path, int *failed)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "replay: %s: no such file or folder\n", path);
        (*failed)++;
        return 0;
    }
    if (!S_ISDIR(sb.st_mode)) {
        *failed += run_file(path);
        return 1;
    }
    DIR *d = opendir(path);
    if (!d) {
        (*failed)++;
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **p = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *p);
            if (!p)
                break;
            names = p;
        }
        size_t len = strlen(path) + strlen(de->d_name) + 2;
        if (!(names[n] = malloc(len)))
            break;
        snprintf(names[n], len, "%s/%s", path, de->d_name);
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_names);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        *failed += run_file(names[i]);
        count++;
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int failed = 0, count = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            count += run_path(argv[i], &failed);
    } else {
        const char *root = getenv("HD_FUZZ_CORPUS");
        char dir[4096];
        if (!root) {
            fprintf(stderr, "replay: give files or set HD_FUZZ_CORPUS\n");
            return 1;
        }
        snprintf(dir, sizeof dir, "%s/%s", root, HD_FUZZ_TARGET);
        count = run_path(dir, &failed);
        if (count == 0) {
            fprintf(stderr, "replay: %s holds no inputs\n", dir);
            return 1;
        }
    }
    printf("replay %s: %d inputs, %d failed to run\n", HD_FUZZ_TARGET, count,
           failed);
    return failed ? 1 : 0;
}
