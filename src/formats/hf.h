/*
 * hf.h — Hugging Face models in: a directory holding config.json and model.safetensors (or
 * shards named by model.safetensors.index.json), or one FILE.safetensors with config.json
 * beside it. config.json's model_type picks the architecture (its hf_model_type), whose own
 * reader (hf_config_read) turns the config into a model_config with the JSON getters below.
 * Tensors are found by the architecture's hf_name column (arch.h: '|' joins parts stacked by
 * rows, '~' a part stored transposed as GPT-2's Conv1D stores it, '^' one stored permuted for
 * rotate-half RoPE as Hugging Face's Llama conversion writes q_proj and k_proj, "%d" the
 * layer), with the one prefix the file puts before every name (GPT-2's optional
 * "transformer."). Every tensor of the files must be one the model reads or one the
 * architecture ignores (hf_ignore: GPT-2's attn.bias masks); every one the model reads must
 * be there with the shape the config gives. A stage reads only its own tensors.
 */
#ifndef PIPELM_HF_H
#define PIPELM_HF_H

#include <stddef.h>
#include <mpi.h>
#include "model/stage.h"
#include "util/json.h" /* the config.json accessors (hf_json_*) */

/* 1 if path names a Hugging Face model (a directory, or a name ending in ".safetensors"). */
int hf_is_model(const char *path);
/* The model of config.json (PL_EIO and a message naming the file and the key). */
int hf_read_config(const char *path, model_config *cfg, char *err, size_t errlen);
/* Load this stage's tensors (any of F32, BF16, F16; to fp32) into host views of its
 * parameters, after checking every tensor name of the files against the model. */
int hf_load_stage(const char *path, stage *st, char *err, size_t errlen);

/* Collective over comm: write the stages' parameters as Hugging Face files, F32 or BF16
 * (ST_F32, ST_BF16; bf16 rounded to nearest even). path ending in ".safetensors": that one
 * file; otherwise a directory (made if missing): config.json (the architecture's
 * hf_config_write, loadable by transformers), model.safetensors, or shards
 * model-0000i-of-0000n.safetensors of at most shard_bytes each (0: no limit) with
 * model.safetensors.index.json. Each rank writes its own tensors at their offsets; files
 * appear under their names only when every rank succeeded. Failures are printed; the agreed
 * status is returned. */
int hf_save(const char *path, stage *st, int dtype, size_t shard_bytes, MPI_Comm comm);
/* 1 if path names a safetensors output (ends in ".safetensors"). */
int hf_is_safetensors_name(const char *path);

#endif
