/*
 * test_shards.c: Check tests for shard sets (src/formats/shards.c through data.h): three llm.c
 * uint32 shards of different sizes whose tokens name their shard and position.
 *
 *   epochs      shuffled: every sequence of an epoch read exactly once (rows of consecutive
 *               batches), inputs and targets the file's tokens; two epochs in different orders;
 *               the same seed the same order, another seed another;
 *   in order    "inorder:": the shards in name order, their sequences in file order;
 *   lists       a comma list of files; a glob that matches nothing and uint16 / uint32 shards
 *               mixed are refused by name.
 *   rows        a replica's rows (data_read_rows) are those rows of the whole batch, for a
 *               shard set, a single file and the Markov source; --shuffle (data_set_shuffle):
 *               0 reads a set in order, 1 shuffles a single file's sequences (every one once an
 *               epoch), and is refused for markov and "inorder:".
 */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/data.h"

#define T 4
#define V (1 << 22)
static const int NSEQ[3] = {5, 3, 7}; /* sequences per shard; shard 1 has two tokens over */
static char dir[256];

static void write_shards(void) {
    snprintf(dir, sizeof dir, "/tmp/test_shards.%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    for (int s = 0; s < 3; s++) {
        size_t n = (size_t)NSEQ[s] * T + 1 + (s == 1 ? 2 : 0);
        uint32_t *t = malloc(n * sizeof *t);
        for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(s * 100000 + i);
        char p[300];
        snprintf(p, sizeof p, "%s/s_%d.bin", dir, s);
        ck_assert_int_eq(data_write_tokens32(p, t, n), 0);
        free(t);
    }
}

/* Read epoch e (15 sequences, batches of 3) into seq[15]: shard * 1000 + sequence index. */
static void read_epoch(data_source *d, int e, int seq[15]) {
    int in[3 * T], tg[3 * T];
    char err[512];
    for (int k = 0; k < 5; k++) {
        ck_assert_msg(data_read_batch(d, e * 5 + k, 3, T, in, tg, err, sizeof err) == 0, "%s", err);
        for (int b = 0; b < 3; b++) {
            int v = in[b * T], s = v / 100000, pos = v % 100000;
            ck_assert_int_eq(pos % T, 0);
            ck_assert_int_lt(pos / T, NSEQ[s]);
            for (int t = 0; t < T; t++) {
                ck_assert_int_eq(in[b * T + t], v + t);
                ck_assert_int_eq(tg[b * T + t], v + t + 1);
            }
            seq[k * 3 + b] = s * 1000 + pos / T;
        }
    }
}

static void open_ok(data_source *d, const char *spec, uint64_t seed) {
    char err[512], p[400];
    snprintf(p, sizeof p, spec, dir);
    ck_assert_msg(data_open(d, p, V, 4, seed, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(data_check_batch(d, 3, T, err, sizeof err) == 0, "%s", err);
}

START_TEST(test_epochs) {
    write_shards();
    data_source d;
    int a[15], b[15], c[15], e1[15];
    open_ok(&d, "%s/s_*.bin", 5);
    ck_assert_int_eq(d.nshards, 3);
    read_epoch(&d, 0, a);
    read_epoch(&d, 1, e1);
    data_close(&d);
    int seen[3][8] = {{0}};
    for (int i = 0; i < 15; i++) seen[a[i] / 1000][a[i] % 1000]++;
    for (int s = 0; s < 3; s++)
        for (int q = 0; q < NSEQ[s]; q++) ck_assert_msg(seen[s][q] == 1, "shard %d sequence %d read %d times", s, q, seen[s][q]);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 15; i++) seen[e1[i] / 1000][e1[i] % 1000]++;
    for (int s = 0; s < 3; s++)
        for (int q = 0; q < NSEQ[s]; q++) ck_assert_int_eq(seen[s][q], 1);
    ck_assert_msg(memcmp(a, e1, sizeof a) != 0, "epochs 0 and 1 in the same order");
    open_ok(&d, "%s/s_*.bin", 5);
    read_epoch(&d, 0, b);
    data_close(&d);
    ck_assert_msg(memcmp(a, b, sizeof a) == 0, "the same seed gave another order");
    open_ok(&d, "%s/s_*.bin", 6);
    read_epoch(&d, 0, c);
    data_close(&d);
    ck_assert_msg(memcmp(a, c, sizeof a) != 0, "another seed gave the same order");
}
END_TEST

START_TEST(test_inorder_and_lists) {
    write_shards();
    data_source d;
    int a[15];
    open_ok(&d, "inorder:%s/s_*.bin", 5);
    read_epoch(&d, 0, a);
    data_close(&d);
    for (int i = 0, s = 0, q = 0; i < 15; i++, q++) {
        if (q == NSEQ[s]) s++, q = 0;
        ck_assert_int_eq(a[i], s * 1000 + q);
    }
    char err[512], p[900];
    snprintf(p, sizeof p, "inorder:%s/s_0.bin,%s/s_2.bin", dir, dir);
    ck_assert_msg(data_open(&d, p, V, 4, 1, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d.nshards, 2);
    ck_assert_int_eq((int)d.ntok, 5 * T + 1 + 7 * T + 1);
    data_close(&d);
    snprintf(p, sizeof p, "%s/nothing_*.bin", dir);
    ck_assert_int_ne(data_open(&d, p, V, 4, 1, 0, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "no file matches it") != NULL, "%s", err);
    uint16_t t16[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    snprintf(p, sizeof p, "%s/s_3.bin", dir);
    ck_assert_int_eq(data_write_tokens(p, t16, 9), 0);
    snprintf(p, sizeof p, "%s/s_*.bin", dir);
    ck_assert_int_ne(data_open(&d, p, V, 4, 1, 0, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "mixed kinds") != NULL && strstr(err, "s_3.bin") != NULL, "%s", err);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Batch k of 6 read whole and as three replicas' pairs of rows: the same tokens. */
static void rows_match(const data_source *d, long long k) {
    int in[6 * T], tg[6 * T], ri[2 * T], rt[2 * T];
    char err[512];
    ck_assert_msg(data_read_batch(d, k, 6, T, in, tg, err, sizeof err) == 0, "%s", err);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(data_read_rows(d, k, 6, 2 * r, 2, T, ri, rt, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(memcmp(ri, in + 2 * r * T, sizeof ri) == 0, "replica %d's inputs of batch %lld", r, k);
        ck_assert_msg(memcmp(rt, tg + 2 * r * T, sizeof rt) == 0, "replica %d's targets of batch %lld", r, k);
    }
    ck_assert_int_ne(data_read_rows(d, k, 6, 5, 2, T, ri, rt, err, sizeof err), 0);
}

START_TEST(test_rows_and_shuffle) {
    write_shards();
    data_source d;
    char err[512], p[400];
    open_ok(&d, "%s/s_*.bin", 5);
    for (long long k = 0; k < 6; k++) rows_match(&d, k);
    ck_assert_int_eq(data_set_shuffle(&d, 0, 5, err, sizeof err), 0);
    int a[15];
    read_epoch(&d, 0, a);
    for (int i = 0, s = 0, q = 0; i < 15; i++, q++) {
        if (q == NSEQ[s]) s++, q = 0;
        ck_assert_int_eq(a[i], s * 1000 + q);
    }
    data_close(&d);
    ck_assert_int_eq(data_open(&d, "markov", 64, 4, 5, 0, err, sizeof err), 0);
    rows_match(&d, 3);
    ck_assert_int_ne(data_set_shuffle(&d, 1, 5, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "--shuffle 1") != NULL, "%s", err);
    data_close(&d);
    open_ok(&d, "inorder:%s/s_*.bin", 5);
    ck_assert_int_ne(data_set_shuffle(&d, 1, 5, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "inorder:") != NULL, "%s", err);
    data_close(&d);
    /* one file of 7 sequences: in order by default, each once an epoch and not in order shuffled */
    snprintf(p, sizeof p, "%s/s_2.bin", dir);
    ck_assert_msg(data_open(&d, p, V, 4, 5, 0, err, sizeof err) == 0, "%s", err);
    rows_match(&d, 2);
    ck_assert_int_eq(data_set_shuffle(&d, 1, 5, err, sizeof err), 0);
    ck_assert_int_eq(d.kind, DATA_SHARDS);
    int in[T], tg[T], seen[7] = {0}, inorder = 1;
    for (int q = 0; q < 7; q++) {
        ck_assert_msg(data_read_batch(&d, q, 1, T, in, tg, err, sizeof err) == 0, "%s", err);
        int l = (in[0] % 100000) / T;
        seen[l]++;
        inorder &= l == q;
    }
    for (int q = 0; q < 7; q++) ck_assert_int_eq(seen[q], 1);
    ck_assert_msg(!inorder, "--shuffle 1 read a single file in order");
    rows_match(&d, 1);
    data_close(&d);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
    Suite *su = suite_create("shards");
    TCase *tc = tcase_create("shards");
    tcase_add_test(tc, test_epochs);
    tcase_add_test(tc, test_inorder_and_lists);
    tcase_add_test(tc, test_rows_and_shuffle);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
