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
#include "pipelm/stage.h"

/* 1 if path names a Hugging Face model (a directory, or a name ending in ".safetensors"). */
int hf_is_model(const char *path);
/* The model of config.json (PL_EIO and a message naming the file and the key). */
int hf_read_config(const char *path, model_config *cfg, char *err, size_t errlen);
/* Load this stage's tensors (any of F32, BF16, F16; to fp32) into host views of its
 * parameters, after checking every tensor name of the files against the model. */
int hf_load_stage(const char *path, stage *st, char *err, size_t errlen);

/* config.json getters for the architectures' readers: key of the object json (a json_t *);
 * required 0 leaves *out as it is when the key is absent or null. Out of [lo, hi], of the
 * wrong type: PL_EIO, naming path and key. */
int hf_json_int(const void *json, const char *path, const char *key, int required, long long lo, long long hi,
                long long *out, char *err, size_t errlen);
int hf_json_num(const void *json, const char *path, const char *key, int required, double lo, double hi, double *out,
                char *err, size_t errlen);
int hf_json_bool(const void *json, const char *path, const char *key, int *out, char *err, size_t errlen);
/* A string value (NULL when absent or not a string). */
const char *hf_json_str(const void *json, const char *key);
/* The object at key (NULL when absent or null), or PL_EIO in *rc when it is another type. */
const void *hf_json_obj(const void *json, const char *path, const char *key, int *rc, char *err, size_t errlen);

#endif
