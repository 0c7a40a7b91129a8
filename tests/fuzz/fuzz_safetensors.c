/*
 * fuzz_safetensors.c — the safetensors reader (src/formats/safetensors.c): the input is the file.
 * An accepted header must describe tensors that lie inside the data, of the size their
 * shape and dtype give, none overlapping another; each tensor of under a million elements
 * is then read in full (a non-finite value may be refused, nothing else).
 */
#include <stdlib.h>
#include <string.h>
#include "fuzz.h"
#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("model.safetensors");
    fuzz_write_file(path, data, size);
    st_file f;
    char err[1024];
    if (st_open(path, &f, err, sizeof err) == 0) {
        for (int i = 0; i < f.n; i++) {
            const st_tensor *t = &f.t[i];
            if (t->end > f.data_bytes || t->end - t->begin != t->numel * st_dtype_size(t->dtype)) {
                fprintf(stderr, "fuzz_safetensors: accepted tensor %s [%zu, %zu) of %zu elements in %zu bytes\n",
                        t->name, t->begin, t->end, t->numel, f.data_bytes);
                abort();
            }
            for (int j = 0; j < i; j++) {
                const st_tensor *u = &f.t[j];
                if (t->begin < t->end && u->begin < u->end && t->begin < u->end && u->begin < t->end) {
                    fprintf(stderr, "fuzz_safetensors: accepted overlapping %s and %s\n", t->name, u->name);
                    abort();
                }
            }
            if (t->numel < (1u << 20)) {
                float *buf = malloc((t->numel ? t->numel : 1) * sizeof(float));
                if (st_read(&f, t, 0, t->numel, buf, err, sizeof err) != 0 && !strstr(err, "non-finite")) {
                    fprintf(stderr, "fuzz_safetensors: an accepted tensor could not be read: %s\n", err);
                    abort();
                }
                free(buf);
            }
        }
        st_close(&f);
    }
    unlink(path);
    return 0;
}
