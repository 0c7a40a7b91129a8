/*
 * fuzz_llmc.c — the llm.c model file reader (src/formats/llmc.c): the input is the whole file.
 * llmc_read_config checks magic, version, dimensions, padded vocab and file size; when it
 * accepts a small model, llmc_load_stage reads every tensor of a one-stage model from it.
 */
#include "fuzz.h"
#include "pipelm/backend.h"
#include "formats/llmc.h"
#include "model/stage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("model.bin");
    fuzz_write_file(path, data, size);
    model_config cfg;
    int version = 0;
    char err[512];
    if (llmc_read_config(path, &cfg, &version, err, sizeof err) == 0 && gpt2_num_params(&cfg) < (1u << 20)) {
        stage st;
        memset(&st, 0, sizeof st);
        if (stage_init(&st, &cfg, 0, cfg.L, 1, 1, 1, 1, 1, &backend_cpu, err, sizeof err) == 0)
            llmc_load_stage(path, &st, err, sizeof err);
        stage_free(&st);
    }
    unlink(path);
    return 0;
}
