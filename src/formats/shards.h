/*
 * shards.h — a data set of many llm.c token files (data.h's DATA_SHARDS): `--data` as a glob
 * ('fw/fineweb_train_*.bin') or a comma list of files or globs, each glob's matches in name
 * order. The shards may have any sizes; uint16 and uint32 shards mixed are refused by name.
 *
 * The set is read as sequences of T + 1 tokens at stride T inside each shard (a sequence never
 * crosses shards): shard s holds (n_s - 1) / T of them, the epoch all of them. Sequence q of
 * the run (q = k B + b for row b of batch k) is sequence q mod N of epoch q / N. Shuffled (the
 * default; llm.c's scheme), epoch e visits the shards in a seeded random order and each shard's
 * sequences in a seeded random order, both bijections keyed by (seed, e, shard) (a Feistel
 * network with cycle walking: no tables, O(1) a sequence), so every sequence is visited once
 * an epoch and batch k is a function of the seed, k, B and T only, never of the layout. With
 * the spec prefix "inorder:", --shuffle 0 or a single shard, the shards and sequences are read in
 * order (documents in order); --shuffle 1 shuffles even one shard (data_set_shuffle).
 */
#ifndef PIPELM_SHARDS_H
#define PIPELM_SHARDS_H

#include <stddef.h>
#include "formats/data.h"

/* Whether spec names a shard set: a comma, a glob character or the "inorder:" prefix. */
int shards_spec(const char *spec);
/* Open every shard of spec (d->V set) into d; PL_EIO / PL_EINVAL naming the file. */
int shards_open(data_source *d, const char *spec, uint64_t seed, char *err, size_t errlen);
/* PL_EIO unless every shard holds one sequence of T + 1 (B is not needed: batches span shards). */
int shards_check(const data_source *d, int T, char *err, size_t errlen);
/* Rows [row0, row0 + n) of batch k of Bg sequences of T tokens, and their targets. */
int shards_read_rows(const data_source *d, long long k, int Bg, int row0, int n, int T, int *inputs, int *targets,
                     char *err, size_t errlen);
/* d->desc from the set's shards, count and order (after the order changed). */
void shards_describe(data_source *d);
/* The shard and first token of sequence q (for tests and messages). */
void shards_locate(const data_source *d, long long q, int T, int *shard, size_t *pos);
void shards_close(data_source *d);

#endif
