/*
 * hf_internal.h — what hf.c (reading) and hf_save.c (writing) share of the hf_name column's
 * reading: a row's parts (name with the layer put in, transposed, permuted for rotate-half),
 * the rows each part holds, the spec of a stage tensor. Not installed.
 */
#ifndef PIPELM_HF_INTERNAL_H
#define PIPELM_HF_INTERNAL_H

#include <stddef.h>
#include "model/model.h"
#include "formats/safetensors.h"

#define HF_MAX_PARTS 68 /* q | k | v, or up to 64 experts (HF_MAX_EXPERTS) of a stacked tensor */
#define HF_MAX_EXPERTS 64

/* One part of an hf_name. */
typedef struct {
    char name[ST_MAX_NAME];
    int transposed, permuted;
} hf_part;

/* The parts of a spec for a layer (INT_MIN: names keep their "%d"), a part naming "%e" as
 * nexp parts (experts 0..nexp-1); their count. */
int hf_split_parts(const char *spec, int layer, int nexp, hf_part *p);
/* The hf_name a tensor of a stage is read from and written to (a tied copy: its
 * embedding's), or NULL when the model's files do not hold it (a tied head row). */
const char *hf_tensor_spec(const model_config *c, const param_tensor *t);
/* Rows of the Hugging Face tensor of part k of n of a stage tensor: all its rows (V of a
 * padded vocabulary) for one part; stacked: the first C, the others the rest in equal shares;
 * stacked experts ("%e"): equal shares. */
size_t hf_part_rows(const model_config *c, const param_tensor *t, int k, int n);
/* The file row of our row r of a part (rows of it, heads of hs rows when permuted). */
size_t hf_file_row(const hf_part *p, size_t r, int hs);

#endif
