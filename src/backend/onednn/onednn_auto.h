/*
 * onednn_auto.h — what --backend auto needs from the oneDNN backend for --precision bf16: the
 * verdict whether its bf16 products beat fp32 ones on this CPU, and the table that acts on it.
 * The verdict goes by the instruction set and vendor, never by a timing (every rank and every
 * run makes the same choice, so the bits do not depend on it): AMX-BF16 tiles, or AVX512-BF16
 * on AMD (one VDPBF16PS does twice the multiply-adds of an fp32 FMA; measured on a Zen 5 EPYC,
 * one thread, 468 against 240 GFLOP/s; Zen 4 not measured), make bf16 products faster;
 * AVX512-BF16 without AMX on Intel (Cooper Lake, Sapphire Rapids with AMX off) runs VDPBF16PS at
 * the fp32 FMA's rate, so with the conversions bf16 products are slower than fp32 ones (issue
 * 22: 0.58-0.75x). backend_onednn_auto is the oneDNN backend (name "onednn", the same ops)
 * whose init, for bf16, runs real bf16 products on a fast verdict and fp32 products on a slow
 * one, its describe line saying which and why, and on a CPU without native bf16 refuses bf16 as
 * --backend onednn does; backend.c finds it as "onednn/auto", config_backend names it for
 * --backend auto --precision bf16. --backend onednn --precision bf16 always multiplies in bf16.
 */
#ifndef PIPELM_ONEDNN_AUTO_H
#define PIPELM_ONEDNN_AUTO_H

#include <stddef.h>
#include "pipelm/backend.h"

/* 1 when bf16 products are faster than fp32 ones here, 0 when not, -1 when this CPU has no
 * native bf16 at all; the reason (a short phrase) in why. PIPELM_ONEDNN_BF16_FAST=0 or 1
 * overrides the verdict (tests). */
int onednn_bf16_products_fast(char *why, size_t len);

extern const backend backend_onednn_auto;

#endif
