/*
 * rng.h — a small, seedable, splittable random number generator (xoshiro256** seeded by
 * splitmix64). pipelm needs streams that depend only on (seed, stream id) — one per parameter
 * tensor, one per data sequence — so results never depend on the rank layout.
 */
#ifndef PIPELM_RNG_H
#define PIPELM_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_state;

/* Seed a stream from a seed and a stream id. */
void rng_seed(rng_state *r, uint64_t seed, uint64_t stream);
uint64_t rng_u64(rng_state *r);
/* Uniform in [0, 1) with 24 random bits. */
float rng_uniform(rng_state *r);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform_d(rng_state *r);
/* Standard normal (Box-Muller, both values computed, one returned). */
float rng_normal(rng_state *r);

#endif
