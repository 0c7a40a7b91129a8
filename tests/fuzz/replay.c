/*
 * replay.c — main() for a fuzz target built without libFuzzer: feed it every file of its
 * corpus, as a regression test in `make check`. Arguments are files or directories; with
 * none, it replays $TOP_SRCDIR/tests/fuzz/corpus/FUZZ_TARGET (TOP_SRCDIR from the test
 * environment, default "."). Prints one line per input it ran, then "N inputs".
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz.h"

#ifndef FUZZ_TARGET
#error FUZZ_TARGET (the corpus name) must be defined
#endif
#define STR2(x) #x
#define STR(x) STR2(x)

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return 1; }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "%s: out of memory\n", path); return 1; }
    printf("run  %s (%zu bytes)\n", path, n);
    fflush(stdout);
    /* an exact-size copy, so ASan sees a read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path, int *count) {
    struct stat sb;
    if (stat(path, &sb) != 0) { perror(path); return 1; }
    if (!S_ISDIR(sb.st_mode)) { (*count)++; return run_file(path); }
    DIR *d = opendir(path);
    if (!d) { perror(path); return 1; }
    char **names = NULL;
    size_t nn = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (nn + 1) * sizeof *names);
        names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < nn; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        rc |= run_path(p, count);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0, count = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) rc |= run_path(argv[i], &count);
    } else {
        const char *top = getenv("TOP_SRCDIR");
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", top ? top : ".", STR(FUZZ_TARGET));
        rc = run_path(dir, &count);
    }
    printf("%d inputs\n", count);
    if (count == 0) { fprintf(stderr, "no inputs\n"); rc = 1; }
    return rc;
}
