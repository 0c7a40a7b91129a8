/*
 * json.c — checked accessors of a JSON object (json.h), through jansson.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "util/common.h"
#include "util/json.h"

int hf_json_int(const void *json, const char *path, const char *key, int required, long long lo, long long hi,
                long long *out, char *err, size_t errlen) {
    json_t *v = json_object_get((const json_t *)json, key);
    if (!v || json_is_null(v)) {
        if (!required) return PL_OK;
        snprintf(err, errlen, "%s: key \"%s\" is missing", path, key);
        return PL_EIO;
    }
    long long x = json_is_integer(v) ? (long long)json_integer_value(v) : 0;
    if (!json_is_integer(v) || x < lo || x > hi) {
        snprintf(err, errlen, "%s: \"%s\" must be an integer in %lld..%lld", path, key, lo, hi);
        return PL_EIO;
    }
    *out = x;
    return PL_OK;
}

int hf_json_num(const void *json, const char *path, const char *key, int required, double lo, double hi, double *out,
                char *err, size_t errlen) {
    json_t *v = json_object_get((const json_t *)json, key);
    if (!v || json_is_null(v)) {
        if (!required) return PL_OK;
        snprintf(err, errlen, "%s: key \"%s\" is missing", path, key);
        return PL_EIO;
    }
    double x = json_is_number(v) ? json_number_value(v) : 0;
    if (!json_is_number(v) || !(x >= lo && x <= hi)) {
        snprintf(err, errlen, "%s: \"%s\" must be a number in [%g, %g]", path, key, lo, hi);
        return PL_EIO;
    }
    *out = x;
    return PL_OK;
}

int hf_json_bool(const void *json, const char *path, const char *key, int *out, char *err, size_t errlen) {
    json_t *v = json_object_get((const json_t *)json, key);
    if (!v || json_is_null(v)) return PL_OK;
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "%s: \"%s\" must be true or false", path, key);
        return PL_EIO;
    }
    *out = json_is_true(v);
    return PL_OK;
}

const char *hf_json_str(const void *json, const char *key) {
    return json_string_value(json_object_get((const json_t *)json, key));
}

void hf_json_set_int(void *json, const char *key, long long v) { json_object_set_new(json, key, json_integer(v)); }
void hf_json_set_num(void *json, const char *key, double v) { json_object_set_new(json, key, json_real(v)); }
void hf_json_set_str(void *json, const char *key, const char *v) { json_object_set_new(json, key, json_string(v)); }
void hf_json_set_float(void *json, const char *key, float v) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) { /* the shortest decimal that reads back as v */
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    json_object_set_new(json, key, json_real(strtod(buf, NULL)));
}
void hf_json_set_bool(void *json, const char *key, int v) { json_object_set_new(json, key, json_boolean(v)); }
void *hf_json_set_obj(void *json, const char *key) {
    json_t *o = json_object();
    json_object_set_new(json, key, o);
    return o;
}

const void *hf_json_obj(const void *json, const char *path, const char *key, int *rc, char *err, size_t errlen) {
    json_t *v = json_object_get((const json_t *)json, key);
    *rc = PL_OK;
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_object(v)) {
        snprintf(err, errlen, "%s: \"%s\" must be an object", path, key);
        *rc = PL_EIO;
        return NULL;
    }
    return v;
}
