/*
 * llmc.h — llm.c model files (`gpt2_124M.bin`): read into and write from pipeline stages.
 *
 * The file is a 256-int32 header (magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V, L,
 * NH, C, Vp) followed by 16 tensors grouped by kind, each holding all layers back to back;
 * or, for Llama 3, llm.c's train_llama3.py layout: magic 20240803, 256 int32 and 256 float32
 * header fields, then GPT-2's 16 slots with lm_head in wpe's, zeros in every bias slot, and
 * fcw (L, 2H, C) holding per layer c_fc (up) then c_fc2 (gate); wte and lm_head with V rows,
 * not Vp (docs/formats.md section 5). A non-zero bias slot is refused by name.
 * The read reports the architecture in cfg->arch.
 * A stage reads only the slices of the layers it owns (strided over the file), so no rank
 * ever holds the whole model. Writing is collective: rank 0 creates the file under a
 * temporary name and sizes it, every rank writes its own tensors at their offsets, all
 * ranks agree, then rank 0 renames it into place.
 */
#ifndef PIPELM_LLMC_H
#define PIPELM_LLMC_H

#include <stddef.h>
#include <mpi.h>
#include "model/stage.h"

#define LLMC_MODEL_MAGIC 20240326
#define LLMC_LLAMA_MAGIC 20240803 /* llm.c's Llama 3 files (docs/formats.md): 2048-byte header */

/* Bytes before the first tensor: 1024 (GPT-2) or 2048 (Llama 3). */
size_t llmc_header_bytes(const model_config *c);

/* Read the header: config and version (3 fp32, 5 bf16). */
int llmc_read_config(const char *path, model_config *cfg, int *version, char *err, size_t errlen);
/* Load the tensors this stage owns from the file (fp32 or bf16), each into a host view of
 * the stage's parameters (backend map/unmap). The file's config must equal the stage's (err
 * names the first setting that differs, with both values); a backend failure is reported
 * with be->error(). After a failure the stage's parameters are unspecified. */
int llmc_load_stage(const char *path, stage *st, char *err, size_t errlen);
/* Collective over comm: write the stages' parameters (or gradients when grads != 0, with
 * the tied wte gradient taken from the first stage) as one fp32 llm.c model file, from host
 * views of the backend buffers (map/unmap). Failures are printed (pl_error, with
 * be->error() for a backend failure) and the agreed status returned. */
int llmc_save(const char *path, stage *st, int grads, MPI_Comm comm);
/* Element offset after the header, in a version-3 file, of the slice of tensor kind `kind`
 * for layer `layer` (-1 for non-block kinds), and its size in floats; a kind the file does
 * not hold gives the end of the file and 0 floats. */
size_t llmc_tensor_offset(const model_config *cfg, int kind, int layer, size_t *numel);

#endif
