/*
 * json.h — checked accessors of a JSON object (jansson's json_t, passed as void * so that no
 * caller needs jansson's header): what the architectures' Hugging Face config.json readers and
 * writers use. Every failure names the file (path) and the key.
 */
#ifndef PIPELM_JSON_H
#define PIPELM_JSON_H

#include <stddef.h>

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
/* config.json setters for the architectures' writers (json a json_t object); hf_json_set_obj
 * adds and returns an empty object. */
void hf_json_set_int(void *json, const char *key, long long v);
void hf_json_set_num(void *json, const char *key, double v);
void hf_json_set_str(void *json, const char *key, const char *v);
void hf_json_set_bool(void *json, const char *key, int v);
/* A float as the shortest decimal that reads back as it (1e-05, not 9.9999997e-06). */
void hf_json_set_float(void *json, const char *key, float v);
void *hf_json_set_obj(void *json, const char *key);

#endif
