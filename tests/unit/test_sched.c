/*
 * test_sched.c: Check tests for the pipeline schedule module (src/pipeline/sched.c):
 * generators, action strings, CSV round trip, validator, simulator, grid.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/sched.h"
#include "pipeline/sched_cost.h"
#include "pipeline/waitsplit.h"

// ----------------------------------------------------------------------------
// helpers

/* build a schedule from CSV text, the way a user-written schedule arrives */
static void from_text(const char *text, sched *s) {
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    rewind(f);
    char err[256] = "";
    int rc = sched_read_csv(f, "hand", s, err, sizeof(err));
    fclose(f);
    ck_assert_msg(rc == 0, "sched_read_csv failed: %s", err);
}

/* run the validator on CSV text and return its message (must fail) */
static void expect_invalid(const char *text, char *err, size_t errlen) {
    sched s;
    from_text(text, &s);
    err[0] = '\0';
    int rc = sched_validate(&s, err, errlen);
    sched_free(&s);
    ck_assert_msg(rc != 0, "validator accepted a bad schedule:\n%s", text);
    ck_assert_msg(strlen(err) > 0, "validator gave no message");
}

/* the CSV text of a generated schedule (caller frees) */
static char *csv_of(const char *name, int P, int M) {
    sched s;
    char err[256];
    ck_assert_int_eq(sched_build(name, P, M, &s, err, sizeof(err)), 0);
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(sched_write_csv(&s, f), 0);
    long len = ftell(f);
    rewind(f);
    char *buf = calloc((size_t)len + 1, 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq((long)fread(buf, 1, (size_t)len, f), len);
    fclose(f);
    sched_free(&s);
    return buf;
}

/* remove one whole cell (e.g. "0SEND_F1") from CSV text in place */
static void drop_cell(char *csv, const char *cell) {
    size_t l = strlen(cell);
    for (char *p = csv; (p = strstr(p, cell)) != NULL; p++) {
        int start_ok = p == csv || p[-1] == ',' || p[-1] == '\n';
        int end_ok = p[l] == ',' || p[l] == '\n' || p[l] == '\0';
        if (!start_ok || !end_ok) continue;
        char *from = p + l;
        if (*from == ',') from++;                       // "cell," -> ""
        else if (p > csv && p[-1] == ',') p--;          // ",cell\n" -> "\n"
        memmove(p, from, strlen(from) + 1);
        return;
    }
    ck_abort_msg("cell %s not found", cell);
}

// ----------------------------------------------------------------------------
// generators

/* every P<=8, M<=16 schedule validates, with the expected memory profile */
START_TEST(test_generators_valid) {
    const char *names[2] = { "gpipe", "1f1b" };
    char err[512];
    for (int k = 0; k < 2; k++) {
        for (int P = 1; P <= 8; P++) {
            for (int M = 1; M <= 16; M++) {
                sched s;
                ck_assert_msg(sched_build(names[k], P, M, &s, err, sizeof(err)) == 0, "%s", err);
                ck_assert_str_eq(s.name, names[k]);
                ck_assert_int_eq(s.P, P);
                ck_assert_int_eq(s.M, M);
                ck_assert_msg(sched_validate(&s, err, sizeof(err)) == 0,
                              "%s P=%d M=%d invalid: %s", names[k], P, M, err);
                for (int r = 0; r < P; r++) {
                    int want = k == 0 ? M : (P - r < M ? P - r : M);
                    ck_assert_msg(sched_max_inflight(&s, r) == want,
                                  "%s P=%d M=%d stage %d inflight %d, want %d",
                                  names[k], P, M, r, sched_max_inflight(&s, r), want);
                    // backward always runs micro-batches in ascending order
                    int last = -1;
                    for (int i = 0; i < s.n[r]; i++) {
                        if (s.acts[r][i].op != SCHED_B) continue;
                        ck_assert_int_eq(s.acts[r][i].mb, last + 1);
                        last = s.acts[r][i].mb;
                    }
                    ck_assert_int_eq(last, M - 1);
                    // exact action count: F, B and the comm actions this stage has
                    int ncomm = (r > 0) * 2 + (r < P - 1) * 2;
                    ck_assert_int_eq(s.n[r], M * (2 + ncomm));
                }
                sched_free(&s);
            }
        }
    }
}
END_TEST

/* the exact action lists of two small schedules */
START_TEST(test_generator_exact_order) {
    // spelled out so a reordering of send/recv shows up immediately
    char *g = csv_of("gpipe", 2, 2);
    ck_assert_str_eq(g,
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n");
    free(g);
    char *o = csv_of("1f1b", 3, 3);
    ck_assert_str_eq(o,
        "0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0RECV_B0,0B0,0RECV_B1,0B1,0RECV_B2,0B2\n"
        "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,1RECV_B0,1B0,1SEND_B0,"
        "1RECV_F2,1F2,1SEND_F2,1RECV_B1,1B1,1SEND_B1,1RECV_B2,1B2,1SEND_B2\n"
        "2RECV_F0,2F0,2B0,2SEND_B0,2RECV_F1,2F1,2B1,2SEND_B1,2RECV_F2,2F2,2B2,2SEND_B2\n");
    free(o);
}
END_TEST

/* bad names and sizes are refused with a message; nothing is leaked */
START_TEST(test_build_errors) {
    sched s;
    char err[256];
    err[0] = '\0';
    ck_assert_int_ne(sched_build("zb", 4, 8, &s, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "unknown schedule 'zb'"));
    ck_assert_int_ne(sched_build(NULL, 4, 8, &s, err, sizeof(err)), 0);
    ck_assert_int_ne(sched_build("gpipe", 0, 8, &s, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "P=0"));
    ck_assert_int_ne(sched_build("1f1b", 4, 0, &s, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "M=0"));
    ck_assert_int_ne(sched_build("1f1b", -3, 4, &s, NULL, 0), 0); // NULL err is fine
    ck_assert_int_eq(sched_max_inflight(&s, 0), -1);              // s was left empty
    sched_free(&s);                                               // and freeing it is fine
    ck_assert_int_eq(sched_build("1f1b", 2, 3, &s, err, sizeof(err)), 0);
    ck_assert_int_eq(sched_max_inflight(&s, 2), -1);
    ck_assert_int_eq(sched_max_inflight(&s, -1), -1);
    sched_free(&s);
}
END_TEST

// ----------------------------------------------------------------------------
// simulator

/* unit-cost GPipe reproduces (P-1)/(M+P-1) */
START_TEST(test_gpipe_bubble) {
    char err[512];
    for (int P = 1; P <= 8; P++) {
        for (int M = 1; M <= 16; M++) {
            sched s;
            sched_sim sim;
            ck_assert_int_eq(sched_build("gpipe", P, M, &s, err, sizeof(err)), 0);
            ck_assert_msg(sched_simulate(&s, &sim, err, sizeof(err)) == 0, "%s", err);
            double want = (double)(P - 1) / (double)(M + P - 1);
            ck_assert_msg(fabs(sim.bubble - want) < 1e-12, "P=%d M=%d bubble %.15f want %.15f",
                          P, M, sim.bubble, want);
            ck_assert_int_eq(sim.makespan, 3 * (M + P - 1));
            ck_assert_int_eq(sim.busy, 3L * M * P);
            sched_sim_free(&sim);
            sched_free(&s);
        }
    }
}
END_TEST

/* 1F1B finishes as early as GPipe with uniform stages */
START_TEST(test_1f1b_makespan) {
    // with uniform stages 1F1B has the same bubble as GPipe, just less memory
    char err[512];
    for (int P = 1; P <= 8; P++) {
        for (int M = 1; M <= 16; M++) {
            sched s;
            sched_sim sim;
            ck_assert_int_eq(sched_build("1f1b", P, M, &s, err, sizeof(err)), 0);
            ck_assert_msg(sched_simulate(&s, &sim, err, sizeof(err)) == 0, "%s", err);
            ck_assert_msg(sim.makespan == 3 * (M + P - 1), "P=%d M=%d makespan %d", P, M, sim.makespan);
            sched_sim_free(&sim);
            sched_free(&s);
        }
    }
}
END_TEST

/* start times of a tiny schedule match a hand computation */
START_TEST(test_sim_times) {
    // gpipe P=2 M=2: hand-computed start times of every action
    sched s;
    sched_sim sim;
    char err[256];
    ck_assert_int_eq(sched_build("gpipe", 2, 2, &s, err, sizeof(err)), 0);
    ck_assert_int_eq(sched_simulate(&s, &sim, err, sizeof(err)), 0);
    // rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
    int want0[8] = { 0, 1, 1, 2, 5, 5, 7, 7 };
    // rank 1: 1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1
    int want1[8] = { 1, 1, 2, 2, 3, 5, 5, 7 };
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(sim.start[sim.off[0] + i], want0[i]);
        ck_assert_int_eq(sim.start[sim.off[1] + i], want1[i]);
    }
    ck_assert_int_eq(sim.end[sim.off[0] + 5], 7); // a backward lasts 2
    ck_assert_int_eq(sim.makespan, 9);
    sched_sim_free(&sim);
    sched_free(&s);
}
END_TEST

// ----------------------------------------------------------------------------
// action strings

/* every action kind formats as torch does and parses back */
START_TEST(test_format_parse_roundtrip) {
    const char *want[SCHED_NOPS] = { "3F12", "3B12", "3SEND_F12", "3RECV_F12", "3SEND_B12", "3RECV_B12", "3I12",
                                      "3W12" };
    char buf[64];
    for (int op = 0; op < SCHED_NOPS; op++) {
        sched_action a = { (sched_op)op, 3, 12 }, b;
        ck_assert_int_eq(sched_action_format(&a, buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, want[op]);
        ck_assert_int_eq(sched_action_parse(buf, &b), 0);
        ck_assert_int_eq(b.op, a.op);
        ck_assert_int_eq(b.stage, a.stage);
        ck_assert_int_eq(b.mb, a.mb);
        for (int st = 0; st < 11; st += 5) {
            for (int mb = 0; mb < 1200; mb += 97) {
                sched_action c = { (sched_op)op, st, mb }, d;
                ck_assert_int_eq(sched_action_format(&c, buf, sizeof(buf)), 0);
                ck_assert_int_eq(sched_action_parse(buf, &d), 0);
                ck_assert(d.op == c.op && d.stage == c.stage && d.mb == c.mb);
            }
        }
    }
    // the examples from the torch docs
    sched_action a;
    ck_assert_int_eq(sched_action_parse("0F3", &a), 0);
    ck_assert(a.op == SCHED_F && a.stage == 0 && a.mb == 3);
    ck_assert_int_eq(sched_action_parse("2RECV_F0", &a), 0);
    ck_assert(a.op == SCHED_RECV_F && a.stage == 2 && a.mb == 0);
    ck_assert_str_eq(sched_op_str(SCHED_SEND_B), "SEND_B");
    ck_assert_ptr_null(sched_op_str((sched_op)17));
    // formatting refuses a too-small buffer and a bad action
    sched_action big = { SCHED_RECV_B, 10, 100 };
    ck_assert_int_ne(sched_action_format(&big, buf, 8), 0);   // "10RECV_B100" needs 12
    ck_assert_int_eq(sched_action_format(&big, buf, 12), 0);
    sched_action bad = { (sched_op)9, 0, 0 };
    ck_assert_int_ne(sched_action_format(&bad, buf, sizeof(buf)), 0);
    sched_action neg = { SCHED_F, 0, -1 };
    ck_assert_int_ne(sched_action_format(&neg, buf, sizeof(buf)), 0);
}
END_TEST

/* malformed action strings are rejected and leave the output alone */
START_TEST(test_parse_rejects_junk) {
    const char *junk[] = {
        "", "F3", "0X3", "0F", "0F-1", "a0F1", "0F1x", "0F1 ", " 0F1", "-1F0",
        "0SEND_F", "0SEND_X1", "0SEND1", "0RECV_F1,", "0f1", "0FF1", "0F1.5",
        "1234567890F1", "0F1234567890", "0UNSHARD", "0WW1", "0I",
    };
    sched_action a = { SCHED_B, 7, 7 };
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
        ck_assert_msg(sched_action_parse(junk[i], &a) != 0, "accepted junk '%s'", junk[i]);
        ck_assert(a.op == SCHED_B && a.stage == 7 && a.mb == 7); // untouched
    }
    ck_assert_int_ne(sched_action_parse(NULL, &a), 0);
}
END_TEST

// ----------------------------------------------------------------------------
// CSV

/* write -> read gives back the same schedule */
START_TEST(test_csv_roundtrip) {
    const char *names[2] = { "gpipe", "1f1b" };
    char err[256];
    for (int k = 0; k < 2; k++) {
        for (int P = 1; P <= 8; P += 3) {
            for (int M = 1; M <= 16; M += 5) {
                sched a, b;
                ck_assert_int_eq(sched_build(names[k], P, M, &a, err, sizeof(err)), 0);
                FILE *f = tmpfile();
                ck_assert_ptr_nonnull(f);
                ck_assert_int_eq(sched_write_csv(&a, f), 0);
                rewind(f);
                ck_assert_msg(sched_read_csv(f, names[k], &b, err, sizeof(err)) == 0, "%s", err);
                fclose(f);
                ck_assert_str_eq(b.name, a.name);
                ck_assert_int_eq(b.P, a.P);
                ck_assert_int_eq(b.M, a.M);
                for (int r = 0; r < P; r++) {
                    ck_assert_int_eq(b.n[r], a.n[r]);
                    for (int i = 0; i < a.n[r]; i++) {
                        ck_assert_int_eq(b.acts[r][i].op, a.acts[r][i].op);
                        ck_assert_int_eq(b.acts[r][i].stage, a.acts[r][i].stage);
                        ck_assert_int_eq(b.acts[r][i].mb, a.acts[r][i].mb);
                    }
                }
                ck_assert_int_eq(sched_validate(&b, err, sizeof(err)), 0);
                sched_free(&a);
                sched_free(&b);
            }
        }
    }
}
END_TEST

/* CSV as Python writes it (CRLF, blanks, empty cells) is accepted */
START_TEST(test_csv_torch_style) {
    // Python's csv.writer ends rows with \r\n; torch writes None as an empty cell
    sched s;
    from_text("0F0, 0SEND_F0 ,,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n", &s);
    ck_assert_int_eq(s.P, 2);
    ck_assert_int_eq(s.M, 1);
    ck_assert_int_eq(s.n[0], 4);
    ck_assert_int_eq(s.n[1], 4);
    ck_assert(s.acts[0][1].op == SCHED_SEND_F && s.acts[0][1].mb == 0);
    char err[256];
    ck_assert_msg(sched_validate(&s, err, sizeof(err)) == 0, "%s", err);
    sched_free(&s);
    // last row without a final newline still counts
    from_text("0F0,0B0", &s);
    ck_assert_int_eq(s.P, 1);
    ck_assert_int_eq(s.n[0], 2);
    sched_free(&s);
}
END_TEST

/* unparsable or empty CSV is refused with a useful message */
START_TEST(test_csv_rejects) {
    const char *bad[] = { "0F0,0Q1\n", "", "\n\n", "0F0\n1F0;1B0\n" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        FILE *f = tmpfile();
        ck_assert_ptr_nonnull(f);
        fputs(bad[i], f);
        rewind(f);
        sched s;
        char err[256] = "";
        ck_assert_msg(sched_read_csv(f, "x", &s, err, sizeof(err)) != 0, "accepted '%s'", bad[i]);
        ck_assert(strlen(err) > 0);
        ck_assert_ptr_null(s.n); // nothing left allocated
        fclose(f);
        if (i == 0) {
            ck_assert_ptr_nonnull(strstr(err, "'0Q1'"));
            ck_assert_ptr_nonnull(strstr(err, "row 1"));
        }
        if (i == 1) ck_assert_msg(strstr(err, "empty") != NULL, "%s", err);
        if (i == 2) ck_assert_msg(strstr(err, "no actions") != NULL, "%s", err);
    }
}
END_TEST

// ----------------------------------------------------------------------------
// validator

/* validator: backward before forward */
START_TEST(test_validate_b_before_f) {
    char err[512];
    expect_invalid("0B0,0F0,0F1,0B1\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "backward before forward") && strstr(err, "rank 0") && strstr(err, "0B0"), "%s", err);
}
END_TEST

/* validator: a stage that never sends a forward output */
START_TEST(test_validate_missing_send_f) {
    // the send and its receive are both gone: rank 0 must still send it
    char err[512];
    char *csv = csv_of("gpipe", 3, 4);
    drop_cell(csv, "0SEND_F1");
    drop_cell(csv, "1RECV_F1");
    expect_invalid(csv, err, sizeof(err));
    ck_assert_msg(strstr(err, "rank 0: missing 0SEND_F1") != NULL, "%s", err);
    free(csv);
}
END_TEST

/* validator: unmatched receive, unmatched send */
START_TEST(test_validate_recv_without_send) {
    char err[512];
    char *csv = csv_of("1f1b", 3, 4);
    drop_cell(csv, "1SEND_F2"); // rank 2 still waits for it
    expect_invalid(csv, err, sizeof(err));
    ck_assert_msg(strstr(err, "rank 2") && strstr(err, "2RECV_F2") && strstr(err, "no matching SEND")
                  && strstr(err, "1SEND_F2 is missing from rank 1"), "%s", err);
    free(csv);
    // and the other way round: a gradient sent that nobody receives
    csv = csv_of("1f1b", 3, 4);
    drop_cell(csv, "0RECV_B3");
    expect_invalid(csv, err, sizeof(err));
    ck_assert_msg(strstr(err, "1SEND_B3") && strstr(err, "no matching RECV"), "%s", err);
    free(csv);
}
END_TEST

/* validator: the same forward twice */
START_TEST(test_validate_duplicate_f) {
    char err[512];
    expect_invalid("0F0,0F1,0F1,0B0,0B1\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "rank 0") && strstr(err, "0F1") && strstr(err, "duplicate"), "%s", err);
}
END_TEST

/* validator: a rank running another stage, a stage out of range */
START_TEST(test_validate_wrong_stage) {
    char err[512];
    // rank 1 claims to run a forward of stage 0
    expect_invalid("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,0F0,1B0,1SEND_B0\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "rank 1") && strstr(err, "0F0") && strstr(err, "wrong stage"), "%s", err);
    // a stage id beyond the pipeline (in memory: a CSV's stages beyond its rows are chunks)
    sched s;
    from_text("0F0,0B0\n", &s);
    s.acts[0][1].stage = 5;
    ck_assert_int_ne(sched_validate(&s, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, "stage 5 out of range 0..0"), "%s", err);
    sched_free(&s);
    // one row with stages up to 5 reads as 6 chunks, too few actions for them
    FILE *f = tmpfile();
    fputs("0F0,0B0,5F0\n", f);
    rewind(f);
    ck_assert_int_ne(sched_read_csv(f, "x", &s, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, "on 6 stages (1 rows) needs at least 6 actions"), "%s", err);
    fclose(f);
}
END_TEST

/* validator: missing backward, comm without a peer, send before compute */
START_TEST(test_validate_missing_and_partnerless) {
    char err[512];
    // a micro-batch with no backward at all
    expect_invalid("0F0,0F1,0B0\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "missing 0B1"), "%s", err);
    // stage 0 has nobody to receive a forward from
    expect_invalid("0RECV_F0,0F0,0B0\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "0RECV_F0") && strstr(err, "no partner"), "%s", err);
    // the last stage has nobody to send its output to
    expect_invalid("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1SEND_F0,1B0,1SEND_B0\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "1SEND_F0") && strstr(err, "no partner"), "%s", err);
    // sending an output before computing it
    expect_invalid("0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "wrong order") && strstr(err, "0SEND_F0"), "%s", err);
}
END_TEST

/* zb-h1 for P = 1..8, M = 1..16: valid, I before W, every I/W/F in ascending order, no more
 * micro-batches held than 1F1B on any stage, and never slower than 1F1B in the unit model
 * (strictly faster once P > 1 and M >= P). */
START_TEST(test_zbh1) {
    char err[512];
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 16; M++) {
            sched z, o;
            ck_assert_msg(sched_build("zb-h1", P, M, &z, err, sizeof err) == 0, "%s", err);
            ck_assert_msg(sched_validate(&z, err, sizeof err) == 0, "zb-h1 P=%d M=%d: %s", P, M, err);
            ck_assert_int_eq(sched_build("1f1b", P, M, &o, err, sizeof err), 0);
            for (int r = 0; r < P; r++) {
                ck_assert_int_le(sched_max_inflight(&z, r), sched_max_inflight(&o, r));
                int next[SCHED_NOPS] = {0};
                for (int i = 0; i < z.n[r]; i++) {
                    const sched_action *a = &z.acts[r][i];
                    ck_assert(a->op != SCHED_B);
                    if (a->op == SCHED_F || a->op == SCHED_I || a->op == SCHED_W)
                        ck_assert_int_eq(a->mb, next[a->op]++);
                }
                ck_assert(next[SCHED_I] == M && next[SCHED_W] == M);
            }
            sched_sim sz, so;
            ck_assert_int_eq(sched_simulate(&z, &sz, err, sizeof err), 0);
            ck_assert_int_eq(sched_simulate(&o, &so, err, sizeof err), 0);
            ck_assert_int_le(sz.makespan, so.makespan);
            if (P > 1 && M >= P) ck_assert_msg(sz.makespan < so.makespan, "P=%d M=%d: zb-h1 %d, 1f1b %d", P, M,
                                               sz.makespan, so.makespan);
            sched_sim_free(&sz);
            sched_sim_free(&so);
            sched_free(&z);
            sched_free(&o);
        }
}
END_TEST

/* validator on split backwards: W before its I, a B beside an I, a missing W, W's out of
 * micro-batch order, an I before its gradient arrives */
START_TEST(test_validate_split_backward) {
    char err[512];
    const char *ok = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0RECV_B1,0I1,0W0,0W1\n"
                     "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1\n";
    sched s;
    from_text(ok, &s);
    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(sched_max_inflight(&s, 0), 2);
    sched_free(&s);
    expect_invalid("0F0,0W0,0I0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "weight part before its input part"), "%s", err);
    expect_invalid("0F0,0I0,0B0,0W0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "both a B and an I"), "%s", err);
    expect_invalid("0F0,0I0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "missing 0W0"), "%s", err);
    expect_invalid("0F0,0F1,0I0,0I1,0W1,0W0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "0W1") && strstr(err, "ascending micro-batch order"), "%s", err);
    expect_invalid("0F0,0SEND_F0,0I0,0RECV_B0,0W0\n1RECV_F0,1F0,1I0,1SEND_B0,1W0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "0RECV_B0") && strstr(err, "wrong order"), "%s", err);
}
END_TEST

/* the measured-cost model: a 2-stage GPipe step with M=1 by hand, the defaults for a
 * missing I/W, and refusals of broken cost files */
START_TEST(test_costs_predict) {
    char err[512];
    const char *txt = "# costs\nstages 2\nmsg_bytes 1000\nlatency_s 0.5\nbytes_per_s 2000\n"
                      "stage 0 F 1 B 2 O 0.25\nstage 1 F 1 B 2 O 0.5\n";
    FILE *f = fmemopen((void *)txt, strlen(txt), "r");
    sched_costs c;
    ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
    fclose(f);
    ck_assert(c.i[0] == 1.0 && c.w[1] == 1.0); /* half of B */
    sched s;
    ck_assert_int_eq(sched_build("gpipe", 2, 1, &s, err, sizeof err), 0);
    sched_pred p;
    ck_assert_int_eq(sched_predict(&s, &c, &p, err, sizeof err), 0);
    /* message 0.5 + 1000/2000 = 1 s: r1 F at 2..3, B 3..5, r0 B from 6 to 8; + O 0.5 */
    ck_assert_msg(fabs(p.makespan_s - 8.0) < 1e-12 && fabs(p.step_s - 8.5) < 1e-12, "%g %g", p.makespan_s, p.step_s);
    ck_assert(fabs(p.wait_s[0] - 5.0) < 1e-12 && fabs(p.wait_s[1] - 2.0) < 1e-12);
    sched_pred_free(&p);
    sched_free(&s);
    ck_assert_int_eq(sched_build("gpipe", 3, 1, &s, err, sizeof err), 0);
    ck_assert_int_ne(sched_predict(&s, &c, &p, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "2 stages") != NULL, "%s", err);
    sched_free(&s);
    sched_costs_free(&c);
    /* finite costs whose sums are not (two 1e308 s forwards; a 1e308-byte message on a
     * 1e-300 B/s link): refused, not an infinite step (fuzz_costs found the first) */
    const char *big[] = {"stages 2\nstage 0 F 1e308 B 1 O 0\nstage 1 F 1e308 B 1 O 0\n",
                         "stages 2\nmsg_bytes 1e308\nbytes_per_s 1e-300\nstage 0 F 1 B 1\nstage 1 F 1 B 1\n"};
    for (int k = 0; k < 2; k++) {
        f = fmemopen((void *)big[k], strlen(big[k]), "r");
        ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
        fclose(f);
        ck_assert_int_eq(sched_build("1f1b", 2, 2, &s, err, sizeof err), 0);
        ck_assert_int_ne(sched_predict(&s, &c, &p, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "overflow") != NULL, "%s", err);
        sched_free(&s);
        sched_costs_free(&c);
    }
    /* activation bytes (A): 1f1b and zb-h1 on 2 ranks hold 2 micro-batches on rank 0 and 1 on rank 1;
     * interleaved-1f1b with 2 chunks, per-stage bytes 1, 10, 100, 1000 (rank 0 holds stages 0
     * and 2), gpipe all M; a per-rank file on a chunked schedule gives each chunk 1/V */
    const char *ta = "stages 2\nstage 0 F 1 B 2 A 3\nstage 1 F 1 B 2 A 5\n";
    f = fmemopen((void *)ta, strlen(ta), "r");
    ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
    fclose(f);
    const struct { const char *name; int V; double r0, r1; } want[] = {
        {"1f1b", 1, 6, 5}, {"zb-h1", 1, 6, 5}, {"gpipe", 1, 12, 20},
        {"looped-bfs", 2, 16, 16}}; /* zb-h1: W frees the slot; looped-bfs stages 0,1: 3/2; 2,3: 5/2 */
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        ck_assert_int_eq(sched_build_chunks(want[k].name, 2, want[k].V, 4, &s, err, sizeof err), 0);
        ck_assert_msg(sched_predict(&s, &c, &p, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(fabs(p.act_peak[0] - want[k].r0) < 1e-9 && fabs(p.act_peak[1] - want[k].r1) < 1e-9,
                      "%s: %g %g", want[k].name, p.act_peak[0], p.act_peak[1]);
        sched_pred_free(&p);
        sched_free(&s);
    }
    sched_costs_free(&c);
    const char *t4 = "stages 4\nstage 0 F 1 B 2 A 1\nstage 1 F 1 B 2 A 10\nstage 2 F 1 B 2 A 100\nstage 3 F 1 B 2 A 1000\n";
    f = fmemopen((void *)t4, strlen(t4), "r");
    ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
    fclose(f);
    ck_assert_int_eq(sched_build_chunks("interleaved-1f1b", 2, 2, 4, &s, err, sizeof err), 0);
    ck_assert_msg(sched_predict(&s, &c, &p, err, sizeof err) == 0, "%s", err);
    /* rank 0's warm-up forwards: stage 0 mb 0..3 (4 x 1), then stage 2 mb 0 (100) before any backward */
    double r0 = 0, peak0 = 0;
    for (int i = 0; i < s.n[0]; i++) { /* the same walk, by hand from the list */
        const sched_action *a = &s.acts[0][i];
        double b = a->stage == 0 ? 1 : 100;
        if (a->op == SCHED_F) r0 += b;
        else if (a->op == SCHED_B) r0 -= b;
        if (r0 > peak0) peak0 = r0;
    }
    ck_assert_msg(fabs(p.act_peak[0] - peak0) < 1e-9 && peak0 >= 104, "%g vs %g", p.act_peak[0], peak0);
    sched_pred_free(&p);
    sched_free(&s);
    sched_costs_free(&c);
    const char *bad[][2] = {{"stage 0 F 1\n", "before 'stages'"}, {"stages 1\nstage 1 F 1\n", "outside 0..0"},
                            {"stages 1\nstage 0 F -1\n", "expected F|B|I|W|O"}, {"stages 1\nspeed 3\n", "unknown key"},
                            {"stages 1\nlatency_s nan\n", "bad latency_s"}, {"", "no 'stages'"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        f = fmemopen((void *)bad[k][0], strlen(bad[k][0]) + 1, "r");
        ck_assert_int_ne(sched_costs_read(f, &c, err, sizeof err), 0);
        ck_assert_msg(strstr(err, bad[k][1]) != NULL, "'%s': %s", bad[k][0], err);
        fclose(f);
    }
}
END_TEST

/* validator and simulator: two ranks each waiting on the other */
START_TEST(test_validate_deadlock) {
    char err[512];
    // each rank receives before sending what the other is waiting for
    const char *dl = "0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
    expect_invalid(dl, err, sizeof(err));
    ck_assert_msg(strstr(err, "deadlock") && strstr(err, "rank 0 blocked at action #0 0RECV_B0")
                  && strstr(err, "rank 1 blocked at action #0 1RECV_F0"), "%s", err);
    // the simulator reports the same thing
    sched s;
    sched_sim sim;
    from_text(dl, &s);
    ck_assert_int_ne(sched_simulate(&s, &sim, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "deadlock"));
    ck_assert_ptr_null(sim.start);
    sched_free(&s);
    // a subtler one: rank 0 waits for the gradient of mb 0 before sending the
    // activation of mb 1, while rank 1 wants that activation before backward 0
    expect_invalid("0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0B0,0RECV_B1,0B1\n"
                   "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n", err, sizeof(err));
    ck_assert_msg(strstr(err, "deadlock") && strstr(err, "rank 0 blocked at action #2 0RECV_B0 (waiting for 1SEND_B0")
                  && strstr(err, "rank 1 blocked at action #2 1RECV_F1 (waiting for 0SEND_F1"), "%s", err);
}
END_TEST

// ----------------------------------------------------------------------------
// grid

/* grid output: exact small grid, alignment, summary lines */
START_TEST(test_print_grid) {
    sched s;
    char err[256];
    ck_assert_int_eq(sched_build("gpipe", 2, 2, &s, err, sizeof(err)), 0);
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    sched_print_grid(&s, f);
    rewind(f);
    char line[512];
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_str_eq(line, "rank 0: F0 F1 .  .  .  B0 B0 B1 B1\n");
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_str_eq(line, "rank 1: .  F0 F1 B0 B0 B1 B1 .  .\n");
    char rest[2048] = "";
    while (fgets(line, sizeof(line), f)) strncat(rest, line, sizeof(rest) - strlen(rest) - 1);
    fclose(f);
    ck_assert_msg(strstr(rest, "gpipe") && strstr(rest, "P=2") && strstr(rest, "M=2"), "%s", rest);
    ck_assert_msg(strstr(rest, "bubble: 33.33%"), "%s", rest);
    ck_assert_msg(strstr(rest, "max in-flight micro-batches per stage: 2 2"), "%s", rest);
    sched_free(&s);

    // wider cells once mb needs two digits; rows stay aligned
    ck_assert_int_eq(sched_build("1f1b", 4, 12, &s, err, sizeof(err)), 0);
    f = tmpfile();
    sched_print_grid(&s, f);
    rewind(f);
    for (int r = 0; r < 4; r++) {
        ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
        size_t len = strlen(line);
        if (r == 0) ck_assert_uint_eq(len, strlen("rank 0:") + 45u * 4u + 1u); // 3*(12+3) columns of " xxx"
        // every cell starts one column after a separator at 7 + 4t
        for (size_t c = 7; c + 1 < len; c += 4) {
            ck_assert_msg(line[c] == ' ' && line[c + 1] != ' ', "rank %d misaligned at %zu: %s", r, c, line);
        }
        ck_assert_msg(len < 2 || line[len - 2] != ' ', "trailing blank: '%s'", line);
    }
    ck_assert_ptr_nonnull(strstr(line, "B11"));
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_str_eq(line, "max in-flight micro-batches per stage: 4 3 2 1\n");
    fclose(f);
    sched_free(&s);
}
END_TEST

// ----------------------------------------------------------------------------
// virtual stages (several chunks per rank)

/* the chunked schedules, the sizes every chunk test runs over (M = 1 and the
   non-multiples of P included: the builders take any M) */
static const char *const chunked[3] = { "interleaved-1f1b", "looped-bfs", "interleaved-zb" };

/* the M to try for P ranks: P, 2P, 3P, and 1, P+1, 2P-1 */
static int chunk_ms(int P, int *ms) {
    int n = 0;
    ms[n++] = P; ms[n++] = 2 * P; ms[n++] = 3 * P; ms[n++] = 1; ms[n++] = P + 1;
    if (2 * P - 1 != P + 1 && 2 * P - 1 != P) ms[n++] = 2 * P - 1;
    return n;
}

/* build by name with chunks or fail the test */
static void build_chunks(const char *name, int P, int V, int M, sched *s) {
    char err[512];
    ck_assert_msg(sched_build_chunks(name, P, V, M, s, err, sizeof err) == 0, "%s P=%d V=%d M=%d: %s", name, P, V,
                  M, err);
}

/* the CSV text of a schedule (caller frees) */
static char *csv_text(const sched *s) {
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(sched_write_csv(s, f), 0);
    long len = ftell(f);
    rewind(f);
    char *buf = calloc((size_t)len + 1, 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq((long)fread(buf, 1, (size_t)len, f), len);
    fclose(f);
    return buf;
}

/* every chunked builder for P in {2,3,4}, V in {2,3}: valid; stage s only on rank s % P;
   each (stage, mb) one F and one B, or one I and one W; F and the weight adders of every
   stage in ascending micro-batch order; the per-stage peaks add up to at least the rank's */
START_TEST(test_chunks_builders_valid) {
    char err[512];
    for (int k = 0; k < 3; k++)
        for (int P = 2; P <= 4; P++)
            for (int V = 2; V <= 3; V++) {
                int ms[6], nm = chunk_ms(P, ms);
                for (int q = 0; q < nm; q++) {
                    int M = ms[q], S = P * V;
                    sched s;
                    build_chunks(chunked[k], P, V, M, &s);
                    ck_assert_int_eq(s.P, P);
                    ck_assert_int_eq(s.V, V);
                    ck_assert_int_eq(s.M, M);
                    ck_assert_int_eq(sched_nstages(&s), S);
                    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s P=%d V=%d M=%d: %s", chunked[k], P, V,
                                  M, err);
                    int *cnt = calloc((size_t)S * M * SCHED_NOPS, sizeof(int));
                    int *nextf = calloc((size_t)S, sizeof(int)), *nextw = calloc((size_t)S, sizeof(int));
                    for (int r = 0; r < P; r++) {
                        int sum = 0;
                        for (int i = 0; i < s.n[r]; i++) {
                            const sched_action *a = &s.acts[r][i];
                            ck_assert_int_eq(a->stage % P, r);
                            cnt[((size_t)a->stage * M + a->mb) * SCHED_NOPS + a->op]++;
                            if (a->op == SCHED_F) ck_assert_int_eq(a->mb, nextf[a->stage]++);
                            if (a->op == SCHED_B || a->op == SCHED_W) ck_assert_int_eq(a->mb, nextw[a->stage]++);
                        }
                        for (int c = 0; c < V; c++) sum += sched_max_inflight_stage(&s, c * P + r);
                        ck_assert_int_le(sched_max_inflight(&s, r), sum);
                        ck_assert_int_ge(sched_max_inflight(&s, r), 1);
                    }
                    for (int st = 0; st < S; st++)
                        for (int mb = 0; mb < M; mb++) {
                            const int *c = &cnt[((size_t)st * M + mb) * SCHED_NOPS];
                            ck_assert_int_eq(c[SCHED_F], 1);
                            ck_assert_msg((c[SCHED_B] == 1 && c[SCHED_I] == 0 && c[SCHED_W] == 0) ||
                                          (c[SCHED_B] == 0 && c[SCHED_I] == 1 && c[SCHED_W] == 1),
                                          "%s P=%d V=%d M=%d stage %d mb %d: B %d I %d W %d", chunked[k], P, V, M, st,
                                          mb, c[SCHED_B], c[SCHED_I], c[SCHED_W]);
                            ck_assert_int_eq(c[SCHED_B], k == 2 ? 0 : 1); /* only interleaved-zb splits */
                        }
                    for (int st = 0; st < S; st++) ck_assert(nextf[st] == M && nextw[st] == M);
                    free(cnt); free(nextf); free(nextw);
                    sched_free(&s);
                }
            }
}
END_TEST

/* interleaved-1f1b's unit-cost bubble: exactly (P-1)/(V*M) of the ideal time 3*V*M when P
   divides M (makespan 3(V*M + P - 1)), and strictly below 1f1b's at the same P and M for
   every M > 1 (M = 1 cannot interleave); interleaved-zb never slower and never holding more
   than interleaved-1f1b; looped-bfs holds V*M per rank */
START_TEST(test_chunks_bubble) {
    char err[512];
    for (int P = 2; P <= 4; P++)
        for (int V = 2; V <= 3; V++) {
            int ms[6], nm = chunk_ms(P, ms);
            for (int q = 0; q < nm; q++) {
                int M = ms[q];
                sched i, z, o, l;
                sched_sim si, sz, so, sl;
                build_chunks("interleaved-1f1b", P, V, M, &i);
                build_chunks("interleaved-zb", P, V, M, &z);
                build_chunks("looped-bfs", P, V, M, &l);
                ck_assert_int_eq(sched_build("1f1b", P, M, &o, err, sizeof err), 0);
                ck_assert_int_eq(sched_simulate(&i, &si, err, sizeof err), 0);
                ck_assert_int_eq(sched_simulate(&z, &sz, err, sizeof err), 0);
                ck_assert_int_eq(sched_simulate(&o, &so, err, sizeof err), 0);
                ck_assert_int_eq(sched_simulate(&l, &sl, err, sizeof err), 0);
                if (M % P == 0) {
                    double want = (double)(P - 1) / (double)(V * M + P - 1);
                    ck_assert_msg(si.makespan == 3 * (V * M + P - 1) && fabs(si.bubble - want) < 1e-12,
                                  "P=%d V=%d M=%d: makespan %d bubble %.6f, theory %d %.6f", P, V, M, si.makespan,
                                  si.bubble, 3 * (V * M + P - 1), want);
                }
                if (M % P == 0) /* Megatron's warm-up: (V-1)P + 2(P-1-r) forwards, then the first F, B pair */
                    for (int r = 0; r < P; r++) {
                        int w = (V - 1) * P + 2 * (P - 1 - r), nf = 0, want = w < V * M ? w + 1 : V * M;
                        for (int x = 0; x < i.n[r] && i.acts[r][x].op != SCHED_B; x++) nf += i.acts[r][x].op == SCHED_F;
                        ck_assert_msg(nf == want, "P=%d V=%d M=%d rank %d: %d forwards before the first backward, "
                                      "want %d", P, V, M, r, nf, want);
                        ck_assert_int_eq(sched_max_inflight(&i, r), want);
                    }
                if (M > 1) ck_assert_msg(si.bubble < so.bubble, "P=%d V=%d M=%d: interleaved %.6f, 1f1b %.6f", P, V,
                                         M, si.bubble, so.bubble);
                else ck_assert(fabs(si.bubble - so.bubble) < 1e-12);
                ck_assert_int_le(sz.makespan, si.makespan);
                for (int r = 0; r < P; r++) {
                    ck_assert_int_le(sched_max_inflight(&z, r), sched_max_inflight(&i, r));
                    ck_assert_int_eq(sched_max_inflight(&l, r), V * M);
                    ck_assert_int_eq(sched_max_inflight_stage(&l, r), M);
                    ck_assert_int_eq(sched_defers_weights(&i, r), 0);
                }
                sched_sim_free(&si); sched_sim_free(&sz); sched_sim_free(&so); sched_sim_free(&sl);
                sched_free(&i); sched_free(&z); sched_free(&o); sched_free(&l);
            }
        }
}
END_TEST

/* the exact lists of two small chunked schedules: the wrap from rank 1's stage 1 to rank 0's
   stage 2, receives right before their compute, sends right after */
START_TEST(test_chunks_exact_order) {
    sched s;
    build_chunks("interleaved-1f1b", 2, 2, 2, &s);
    char *t = csv_text(&s);
    ck_assert_str_eq(t,
        "0F0,0SEND_F0,0F1,0SEND_F1,2RECV_F0,2F0,2SEND_F0,2RECV_F1,2F1,2SEND_F1,2RECV_B0,2B0,2SEND_B0,"
        "2RECV_B1,2B1,2SEND_B1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,3F1,3B1,3SEND_B1,"
        "1RECV_B0,1B0,1SEND_B0,1RECV_B1,1B1,1SEND_B1\n");
    free(t);
    sched_free(&s);
    build_chunks("looped-bfs", 2, 2, 2, &s);
    t = csv_text(&s);
    ck_assert_str_eq(t,
        "0F0,0SEND_F0,0F1,0SEND_F1,2RECV_F0,2F0,2SEND_F0,2RECV_F1,2F1,2SEND_F1,2RECV_B0,2B0,2SEND_B0,"
        "2RECV_B1,2B1,2SEND_B1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,3RECV_F1,3F1,3B0,3SEND_B0,3B1,3SEND_B1,"
        "1RECV_B0,1B0,1SEND_B0,1RECV_B1,1B1,1SEND_B1\n");
    free(t);
    sched_free(&s);
}
END_TEST

/* FNV-1a 64 of a text, continuing from h */
static unsigned long long fnv1a(const char *p, unsigned long long h) {
    for (; *p; p++) { h ^= (unsigned char)*p; h *= 0x100000001b3ULL; }
    return h;
}

/* V = 1 is bit-for-bit what it was before chunks: the CSV text of gpipe, 1f1b and zb-h1
   over P in {1,2,3,4,5,8}, M in {1,2,3,4,7,8,12,16}, hashed as written by the build before
   the change; and the chunked names with V = 1 build exactly those */
START_TEST(test_chunks_v1_unchanged) {
    const char *names[3] = { "gpipe", "1f1b", "zb-h1" };
    const char *same[3] = { "looped-bfs", "interleaved-1f1b", "interleaved-zb" }; /* with V = 1 */
    const unsigned long long want[3] = { 0x2e6cf67197ac046fULL, 0x1fcc30f96f736ff5ULL, 0x2e1ce8ec34ccecd4ULL };
    const int Ps[6] = { 1, 2, 3, 4, 5, 8 }, Ms[8] = { 1, 2, 3, 4, 7, 8, 12, 16 };
    for (int k = 0; k < 3; k++) {
        unsigned long long h = 0xcbf29ce484222325ULL;
        for (int a = 0; a < 6; a++)
            for (int b = 0; b < 8; b++) {
                sched s, c;
                build_chunks(names[k], Ps[a], 1, Ms[b], &s);
                ck_assert_int_eq(s.V, 1);
                char *t = csv_text(&s);
                h = fnv1a(t, h);
                build_chunks(same[k], Ps[a], 1, Ms[b], &c);
                char *u = csv_text(&c);
                ck_assert_str_eq(t, u);
                free(t); free(u);
                sched_free(&s); sched_free(&c);
            }
        ck_assert_msg(h == want[k], "%s: CSV hash %llx, before chunks %llx", names[k], h, want[k]);
    }
}
END_TEST

/* refusals: the one-chunk schedules with V > 1 (naming those that take chunks), zb-v and
   dualpipev with V != 2, V < 1 */
START_TEST(test_chunks_build_errors) {
    sched s;
    char err[512];
    ck_assert_int_ne(sched_build_chunks("1f1b", 4, 2, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "1f1b runs one chunk per rank") && strstr(err, "interleaved-1f1b, looped-bfs, "
                  "interleaved-zb"), "%s", err);
    ck_assert_ptr_null(s.n);
    ck_assert_int_ne(sched_build_chunks("zb-h1", 2, 3, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "zb-h1 runs one chunk per rank"), "%s", err);
    ck_assert_int_ne(sched_build_chunks("zb-v", 4, 3, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "zb-v runs exactly 2 chunks per rank"), "%s", err);
    ck_assert_int_ne(sched_build_chunks("dualpipev", 4, 1, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "dualpipev runs exactly 2 chunks per rank"), "%s", err);
    ck_assert_int_ne(sched_build_chunks("interleaved-1f1b", 4, 0, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "V=0"), "%s", err);
    ck_assert_int_ne(sched_build_chunks("looped-bfs", 1 << 12, 1 << 5, 8, &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "too large"), "%s", err);
    ck_assert_int_eq(sched_max_inflight_stage(&s, 0), -1);
    ck_assert_int_eq(sched_defers_weights_stage(&s, 0), 0);
    ck_assert_ptr_nonnull(sched_constraint("interleaved-1f1b"));
    ck_assert_ptr_null(sched_constraint("zigzag"));
    build_chunks("interleaved-zb", 3, 2, 6, &s);
    ck_assert_int_eq(sched_max_inflight_stage(&s, 6), -1);
    ck_assert_int_eq(sched_max_inflight_stage(&s, -1), -1);
    int defers = 0;
    for (int st = 0; st < 6; st++) defers += sched_defers_weights_stage(&s, st);
    ck_assert_int_gt(defers, 0);
    for (int r = 0; r < 3; r++)
        ck_assert_int_eq(sched_defers_weights(&s, r), sched_defers_weights_stage(&s, r) ||
                         sched_defers_weights_stage(&s, r + 3));
    sched_free(&s);
}
END_TEST

/* CSV round trip with chunks: V is inferred from the stages, the actions come back */
START_TEST(test_chunks_csv_roundtrip) {
    char err[512];
    for (int k = 0; k < 3; k++)
        for (int P = 2; P <= 4; P++)
            for (int V = 2; V <= 3; V++) {
                int M = 2 * P + 1;
                sched a, b;
                build_chunks(chunked[k], P, V, M, &a);
                char *t = csv_text(&a);
                FILE *f = tmpfile();
                fputs(t, f);
                rewind(f);
                ck_assert_msg(sched_read_csv(f, chunked[k], &b, err, sizeof err) == 0, "%s", err);
                fclose(f);
                ck_assert(b.P == P && b.V == V && b.M == M);
                for (int r = 0; r < P; r++) {
                    ck_assert_int_eq(b.n[r], a.n[r]);
                    ck_assert(memcmp(b.acts[r], a.acts[r], sizeof(sched_action) * (size_t)a.n[r]) == 0);
                }
                ck_assert_msg(sched_validate(&b, err, sizeof err) == 0, "%s", err);
                char *u = csv_text(&b);
                ck_assert_str_eq(t, u);
                free(t); free(u);
                sched_free(&a); sched_free(&b);
            }
}
END_TEST

/* hand-written chunked CSVs that break one rule each (P = 2 ranks, V = 2: stages 0..3) */
START_TEST(test_chunks_invalid_csv) {
    char err[512];
    /* a valid one first: stage 1's output wraps to stage 2 on rank 0 */
    const char *ok = "0F0,0SEND_F0,2RECV_F0,2F0,2SEND_F0,2RECV_B0,2I0,2SEND_B0,0RECV_B0,0I0,2W0,0W0\n"
                     "1RECV_F0,1F0,1SEND_F0,3RECV_F0,3F0,3I0,3SEND_B0,1RECV_B0,1I0,1SEND_B0,3W0,1W0\n";
    sched s;
    from_text(ok, &s);
    ck_assert_int_eq(s.V, 2);
    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(sched_max_inflight(&s, 0), 2);
    ck_assert_int_eq(sched_max_inflight_stage(&s, 2), 1);
    sched_free(&s);
    /* stage 2 on row 1 (it runs on rank 0) */
    expect_invalid("0F0,0SEND_F0,0RECV_B0,0B0,3RECV_F0,3F0,3B0,3SEND_B0\n"
                   "1RECV_F0,1F0,1SEND_F0,2RECV_F0,2F0,2SEND_F0,2RECV_B0,2B0,2SEND_B0,1RECV_B0,1B0,1SEND_B0\n",
                   err, sizeof err);
    ck_assert_msg(strstr(err, "rank 0, action #4 (3RECV_F0): wrong stage, stage 3 runs on rank 1"), "%s", err);
    /* stage 1 sends its output to stage 2, which lives on rank 0: rank 0 must receive it there */
    char *t = strdup(ok);
    drop_cell(t, "2RECV_F0");
    expect_invalid(t, err, sizeof err);
    ck_assert_msg(strstr(err, "rank 1, action #2 (1SEND_F0): no matching RECV on the peer (2RECV_F0 is missing "
                  "from rank 0)"), "%s", err);
    free(t);
    /* the last stage (3) has nobody to send its output to */
    expect_invalid("0F0,0SEND_F0,2RECV_F0,2F0,2SEND_F0,2RECV_B0,2B0,2SEND_B0,0RECV_B0,0B0\n"
                   "1RECV_F0,1F0,1SEND_F0,3RECV_F0,3F0,3SEND_F0,3B0,3SEND_B0,1RECV_B0,1B0,1SEND_B0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "3SEND_F0") && strstr(err, "no partner, stage 3 is the last stage"), "%s", err);
    /* a W before its I within a chunk */
    expect_invalid("0F0,0SEND_F0,2RECV_F0,2F0,2SEND_F0,2RECV_B0,2W0,2I0,2SEND_B0,0RECV_B0,0I0,0W0\n"
                   "1RECV_F0,1F0,1SEND_F0,3RECV_F0,3F0,3I0,3SEND_B0,1RECV_B0,1I0,1SEND_B0,3W0,1W0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "rank 0, action #6 (2W0): weight part before its input part"), "%s", err);
    /* the weight order broken within stage 2 (across stages any order is fine: 3W0 after 1W0 below) */
    const char *two = "0F0,0SEND_F0,0F1,0SEND_F1,2RECV_F0,2F0,2SEND_F0,2RECV_F1,2F1,2SEND_F1,"
                      "2RECV_B0,2I0,2SEND_B0,2RECV_B1,2I1,2SEND_B1,%s,0RECV_B0,0B0,0RECV_B1,0B1\n"
                      "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,3RECV_F1,3F1,3I0,3SEND_B0,"
                      "3I1,3SEND_B1,1RECV_B0,1B0,1SEND_B0,1RECV_B1,1B1,1SEND_B1,3W0,3W1\n";
    char buf[1024];
    snprintf(buf, sizeof buf, two, "2W0,2W1");
    from_text(buf, &s);
    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(sched_defers_weights_stage(&s, 2), 1);
    ck_assert_int_eq(sched_defers_weights_stage(&s, 0), 0);
    ck_assert_int_eq(sched_defers_weights(&s, 0), 1);
    sched_free(&s);
    snprintf(buf, sizeof buf, two, "2W1,2W0");
    expect_invalid(buf, err, sizeof err);
    ck_assert_msg(strstr(err, "rank 0, action #16 (2W1): comes before 2W0") && strstr(err, "ascending micro-batch "
                  "order on each stage"), "%s", err);
    /* a deadlock across the wrap: rank 0 waits for stage 1's output before sending stage 0's */
    expect_invalid("2RECV_F0,0F0,0SEND_F0,2F0,2SEND_F0,2RECV_B0,2B0,2SEND_B0,0RECV_B0,0B0\n"
                   "1RECV_F0,1F0,1SEND_F0,3RECV_F0,3F0,3B0,3SEND_B0,1RECV_B0,1B0,1SEND_B0\n", err, sizeof err);
    ck_assert_msg(strstr(err, "deadlock") && strstr(err, "rank 0 blocked at action #0 2RECV_F0 (waiting for 1SEND_F0 "
                  "from rank 1)"), "%s", err);
    /* stages that are not a whole number of chunks per row */
    FILE *f = tmpfile();
    fputs("0F0,0B0,2F0,2B0,4F0,4B0\n1F0,1B0,3F0,3B0\n", f);
    rewind(f);
    ck_assert_int_ne(sched_read_csv(f, "x", &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "stages 0..4 (5) on 2 rows") && strstr(err, "multiple of the row count"), "%s", err);
    fclose(f);
}
END_TEST

/* zb-v and dualpipev for P = 1..4, M = 1..2P+2: valid, placed V (stage s on rank s, then
   2P-1-s), no messages between rank P-1's two stages, zb-v within 1f1b's memory (2P chunk
   slots) and with a unit-cost bubble no larger than zb-h1's once M >= P */
START_TEST(test_vshape_builders) {
    char err[512];
    const char *names[2] = {"zb-v", "dualpipev"};
    for (int k = 0; k < 2; k++)
        for (int P = 1; P <= 4; P++)
            for (int M = 1; M <= 2 * P + 2; M++) {
                sched s;
                build_chunks(names[k], P, 2, M, &s);
                ck_assert_int_eq(s.place, SCHED_PLACE_V);
                ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s P=%d M=%d: %s", names[k], P, M, err);
                for (int r = 0; r < P; r++) {
                    for (int i = 0; i < s.n[r]; i++) {
                        const sched_action *a = &s.acts[r][i];
                        ck_assert_int_eq(a->stage < P ? a->stage : 2 * P - 1 - a->stage, r);
                        int comm = a->op != SCHED_F && a->op != SCHED_B && a->op != SCHED_I && a->op != SCHED_W;
                        ck_assert(!(comm && r == P - 1 && (a->stage == P - 1 || a->stage == P) &&
                                    (a->op == SCHED_SEND_F ? a->stage == P - 1 : a->op == SCHED_RECV_F ? a->stage == P
                                     : a->op == SCHED_SEND_B ? a->stage == P : a->stage == P - 1)));
                    }
                    if (k == 0) ck_assert_int_le(sched_max_inflight(&s, r), 2 * P);
                }
                if (k == 0 && P > 1 && M >= P) {
                    sched h;
                    sched_sim a, b;
                    build_chunks("zb-h1", P, 1, M, &h);
                    ck_assert_int_eq(sched_simulate(&s, &a, err, sizeof err), 0);
                    ck_assert_int_eq(sched_simulate(&h, &b, err, sizeof err), 0);
                    ck_assert_msg(a.bubble <= b.bubble, "P=%d M=%d: zb-v %.3f zb-h1 %.3f", P, M, a.bubble, b.bubble);
                    sched_sim_free(&a); sched_sim_free(&b); sched_free(&h);
                }
                sched_free(&s);
            }
}
END_TEST

/* the placement map: the V shape and the loop, both ways round */
START_TEST(test_place_map) {
    for (int P = 1; P <= 5; P++)
        for (int place = SCHED_PLACE_LOOP; place <= SCHED_PLACE_V; place++)
            for (int r = 0; r < P; r++)
                for (int c = 0; c < 3; c++) {
                    int st = sched_place_stage(place, P, r, c);
                    ck_assert_int_eq(sched_place_rank(place, P, st), r);
                    ck_assert_int_eq(sched_place_chunk(place, P, st), c);
                    if (place == SCHED_PLACE_LOOP) ck_assert_int_eq(st, c * P + r);
                    if (place == SCHED_PLACE_V && c < 2) ck_assert_int_eq(st, c ? 2 * P - 1 - r : r);
                }
    ck_assert_str_eq(sched_place_name(SCHED_PLACE_V), "v");
    ck_assert_int_eq(sched_default_chunks("zb-v"), 2);
    ck_assert_int_eq(sched_default_chunks("1f1b"), 1);
    ck_assert_int_eq(sched_name_place("dualpipev"), SCHED_PLACE_V);
}
END_TEST

/* V-shaped CSVs: a generated one reads back placed V with the same actions; torch's
   overlapped cell reads as its two actions; a rank's two stages out of order are refused */
START_TEST(test_vshape_csv) {
    char err[512];
    for (int P = 2; P <= 4; P++) {
        sched a, b;
        build_chunks("dualpipev", P, 2, 2 * P + 1, &a);
        char *t = csv_text(&a);
        from_text(t, &b);
        ck_assert(b.P == P && b.V == 2 && b.place == SCHED_PLACE_V);
        for (int r = 0; r < P; r++) {
            ck_assert_int_eq(b.n[r], a.n[r]);
            ck_assert(memcmp(b.acts[r], a.acts[r], sizeof(sched_action) * (size_t)a.n[r]) == 0);
        }
        ck_assert_msg(sched_validate(&b, err, sizeof err) == 0, "%s", err);
        free(t);
        sched_free(&a); sched_free(&b);
    }
    const char *row1 = "1RECV_F0,1F0,2F0,2SEND_F0,1RECV_F1,1F1,2F1,2SEND_F1,2RECV_B0,2B0,1B0,1SEND_B0,2RECV_B1,2B1,1B1,"
                       "1SEND_B1\n";
    char text[1024], flat[1024];
    snprintf(text, sizeof text, "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,0RECV_B0, "
             "(3F1;0B0)OVERLAP_F_B ,3B1,3SEND_B1,0RECV_B1,0B1\n%s", row1);
    snprintf(flat, sizeof flat, "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,0RECV_B0,3F1,0B0,3B1,"
             "3SEND_B1,0RECV_B1,0B1\n%s", row1);
    sched s;
    from_text(text, &s);
    ck_assert_int_eq(s.place, SCHED_PLACE_V);
    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s", err);
    char *u = csv_text(&s);
    ck_assert_str_eq(u, flat);
    free(u);
    sched_free(&s);
    snprintf(text, sizeof text, "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,0RECV_B0,3F1,0B0,3B1,"
             "3SEND_B1,0RECV_B1,0B1\n1RECV_F0,2F0,1F0,2SEND_F0,1RECV_F1,1F1,2F1,2SEND_F1,2RECV_B0,2B0,1B0,1SEND_B0,"
             "2RECV_B1,2B1,1B1,1SEND_B1\n");
    expect_invalid(text, err, sizeof err);
    ck_assert_msg(strstr(err, "rank 1, action #1 (2F0): comes before 1F0") && strstr(err, "same rank"), "%s", err);
    snprintf(text, sizeof text, "(3F1;0B0)OVERLAP\n");
    FILE *f = tmpfile();
    fputs(text, f);
    rewind(f);
    ck_assert_int_ne(sched_read_csv(f, "x", &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "cannot parse action '(3F1;0B0)OVERLAP'"), "%s", err);
    fclose(f);
}
END_TEST

/* the wait split: a stage measured 2x its baseline is named, the parts add up to the wait */
START_TEST(test_wait_split) {
    sched s;
    build_chunks("1f1b", 3, 1, 6, &s);
    sched_costs base, meas;
    ck_assert_int_eq(sched_costs_alloc(&base, 3), 0);
    ck_assert_int_eq(sched_costs_alloc(&meas, 3), 0);
    for (int st = 0; st < 3; st++) {
        base.f[st] = 0.01, base.b[st] = 0.02;
        meas.f[st] = st == 1 ? 0.02 : 0.01, meas.b[st] = st == 1 ? 0.04 : 0.02;
    }
    double measured[3] = {0.20, 0.05, 0.15}, flops[3] = {1, 1, 1};
    wait_split w;
    char err[512];
    ck_assert_msg(wait_split_compute(&s, &meas, &base, NULL, 0.001, measured, &w, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(w.worst, 1);
    ck_assert(fabs(w.over[1] - 1.0) < 1e-9 && fabs(w.over[0]) < 1e-9);
    ck_assert_msg(strstr(w.why, "stage 1 on rank 1: F and B 100% over cost; ranks 0,2 wait"), "%s", w.why);
    for (int r = 0; r < 3; r++) {
        ck_assert(fabs(w.sched_s[r] + w.straggler_s[r] + w.transfer_s[r] + w.other_s[r] - measured[r]) < 1e-12);
        ck_assert(w.transfer_s[r] >= 0 && w.straggler_s[r] >= 0 && w.sched_s[r] >= 0);
    }
    ck_assert(w.straggler_s[0] > 0 && w.straggler_s[2] > 0 && w.straggler_s[1] == 0);
    wait_split_free(&w);
    /* no baseline file: the median cost per FLOP; equal FLOPs, so the same stage stands out */
    ck_assert_int_eq(wait_split_compute(&s, &meas, NULL, flops, 0.0, measured, &w, err, sizeof err), 0);
    ck_assert_int_eq(w.worst, 1);
    ck_assert(w.transfer_s[0] == 0 && w.transfer_s[1] == 0);
    wait_split_free(&w);
    /* nothing over cost: no straggler */
    ck_assert_int_eq(wait_split_compute(&s, &base, &base, NULL, 0.0, measured, &w, err, sizeof err), 0);
    ck_assert_int_eq(w.worst, -1);
    ck_assert_str_eq(w.why, "");
    wait_split_free(&w);
    sched_costs_free(&base);
    sched_costs_free(&meas);
    sched_free(&s);
}
END_TEST

/* the grid with chunks: cells carry the global stage, per-rank peaks and bubbles, the theory */
START_TEST(test_chunks_print_grid) {
    sched s;
    build_chunks("interleaved-1f1b", 2, 2, 2, &s);
    FILE *f = tmpfile();
    sched_print_grid(&s, f);
    rewind(f);
    char line[1024], rest[4096] = "";
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_str_eq(line, "rank 0: 0F0 0F1 2F0 2F1 .   .   2B0 2B0 .   2B1 2B1 0B0 0B0 0B1 0B1\n");
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_str_eq(line, "rank 1: .   1F0 1F1 3F0 3B0 3B0 3F1 3B1 3B1 1B0 1B0 1B1 1B1 .   .\n");
    while (fgets(line, sizeof line, f)) strncat(rest, line, sizeof rest - strlen(rest) - 1);
    fclose(f);
    ck_assert_msg(strstr(rest, "P=2 ranks x V=2 chunks = 4 stages") && strstr(rest, "makespan 15 units") &&
                  strstr(rest, "bubble: 20.00%"), "%s", rest);
    ck_assert_msg(strstr(rest, "rank 0: peak in-flight 4 (stages 0:2 2:2), bubble 20.00%\n") &&
                  strstr(rest, "rank 1: peak in-flight 3 (stages 1:2 3:1), bubble 20.00%\n"), "%s", rest);
    ck_assert_msg(strstr(rest, "(P-1)/(V*M) = 25.00% of the ideal time") && strstr(rest, "(P-1)/(V*M+P-1) = 20.00%"),
                  "%s", rest);
    sched_free(&s);
}
END_TEST

/* measured costs on chunks: one line per global stage, or a per-rank (V = 1) file scaled by
   1/V; unit costs give back the unit-cost makespan; other sizes are refused */
START_TEST(test_chunks_costs) {
    char err[512];
    sched s;
    sched_sim sim;
    build_chunks("interleaved-1f1b", 2, 2, 4, &s);
    ck_assert_int_eq(sched_simulate(&s, &sim, err, sizeof err), 0);
    const char *per_stage = "stages 4\nstage 0 F 1 B 2 O 1\nstage 1 F 1 B 2 O 1\nstage 2 F 1 B 2 O 2\n"
                            "stage 3 F 1 B 2 O 1\n";
    const char *per_rank = "stages 2\nstage 0 F 2 B 4 O 2\nstage 1 F 2 B 4 O 2\n";
    const char *texts[2] = { per_stage, per_rank };
    for (int k = 0; k < 2; k++) {
        FILE *f = fmemopen((void *)texts[k], strlen(texts[k]), "r");
        sched_costs c;
        ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
        fclose(f);
        sched_pred p;
        ck_assert_msg(sched_predict(&s, &c, &p, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(fabs(p.makespan_s - sim.makespan) < 1e-9 && fabs(p.bubble - sim.bubble) < 1e-9, "%g %g",
                      p.makespan_s, p.bubble);
        ck_assert_msg(fabs(p.step_s - p.makespan_s - (k == 0 ? 3.0 : 2.0)) < 1e-9, "%g", p.step_s); /* rank 0: 1 + 2 */
        sched_pred_free(&p);
        sched_costs_free(&c);
    }
    /* uneven: rank-file stage 0 (F 2, B 4) holds stages 0 and 1, its stage 1 (F 4, B 8)
       holds stages 2 and 3, each at half the cost: the same as the per-stage file below */
    const char *uneven[2] = { "stages 2\nstage 0 F 2 B 4\nstage 1 F 4 B 8\n",
                              "stages 4\nstage 0 F 1 B 2\nstage 1 F 1 B 2\nstage 2 F 2 B 4\nstage 3 F 2 B 4\n" };
    sched_pred up[2];
    for (int k = 0; k < 2; k++) {
        FILE *f = fmemopen((void *)uneven[k], strlen(uneven[k]), "r");
        sched_costs c;
        ck_assert_msg(sched_costs_read(f, &c, err, sizeof err) == 0, "%s", err);
        fclose(f);
        ck_assert_msg(sched_predict(&s, &c, &up[k], err, sizeof err) == 0, "%s", err);
        sched_costs_free(&c);
    }
    ck_assert_msg(fabs(up[0].makespan_s - up[1].makespan_s) < 1e-9 && up[0].makespan_s > sim.makespan, "%g %g",
                  up[0].makespan_s, up[1].makespan_s);
    for (int r = 0; r < 2; r++) ck_assert(fabs(up[0].busy_s[r] - up[1].busy_s[r]) < 1e-9);
    ck_assert(fabs(up[0].busy_s[0] - 4 * 3.0 - 4 * 6.0) < 1e-9); /* rank 0: stages 0 (1+2) and 2 (2+4), M = 4 */
    sched_pred_free(&up[0]);
    sched_pred_free(&up[1]);
    const char *three = "stages 3\nstage 0 F 1\n";
    FILE *f = fmemopen((void *)three, strlen(three), "r");
    sched_costs c;
    ck_assert_int_eq(sched_costs_read(f, &c, err, sizeof err), 0);
    fclose(f);
    sched_pred p;
    ck_assert_int_ne(sched_predict(&s, &c, &p, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "costs are for 3 stages, the schedule has 2 ranks x 2 chunks = 4 stages"), "%s", err);
    sched_costs_free(&c);
    sched_sim_free(&sim);
    sched_free(&s);
}
END_TEST

// ----------------------------------------------------------------------------

/* collect all cases into one suite */
/* every registered schedule (sched_registry.c): built for P 1-4, M 1-7 and the chunks its row
   allows, it validates, its unit-cost simulation ends (no deadlock) with every action run, and
   a CSV round trip gives the same schedule: a new row is checked without a line here */
START_TEST(test_registry_all) {
    int n = 0;
    for (const sched_kind *k = sched_kinds; k->name; k++) {
        ck_assert_ptr_eq(sched_kind_find(k->name), k);
        ck_assert_ptr_nonnull(k->generate);
        ck_assert_ptr_nonnull(k->rule);
        for (int P = 1; P <= 4; P++)
            for (int M = 1; M <= 7; M++)
                for (int V = 1; V <= 3; V++) {
                    if ((k->chunks == SCHED_CHUNKS_ONE && V > 1) || (k->chunks == SCHED_CHUNKS_V && V != 2)) continue;
                    sched s;
                    sched_sim sim;
                    char err[512];
                    ck_assert_msg(sched_build_chunks(k->name, P, V, M, &s, err, sizeof err) == 0, "%s", err);
                    ck_assert_msg(sched_validate(&s, err, sizeof err) == 0, "%s P=%d V=%d M=%d: %s", k->name, P, V,
                                  M, err);
                    ck_assert_msg(sched_simulate(&s, &sim, err, sizeof err) == 0, "%s P=%d V=%d M=%d: %s", k->name,
                                  P, V, M, err);
                    ck_assert_int_gt(sim.makespan, 0);
                    sched_sim_free(&sim);
                    sched_free(&s);
                    n++;
                }
    }
    ck_assert_int_ge(n, sched_kind_count() * 28);
    char names[512];
    sched_kind_names(names, sizeof names);
    ck_assert_msg(strstr(names, "gpipe, 1f1b") && strstr(names, "dualpipev"), "%s", names);
    ck_assert_ptr_null(sched_kind_find("zigzag"));
    ck_assert_ptr_null(sched_kind_find(NULL));
}
END_TEST

static Suite *sched_suite(void) {
    Suite *su = suite_create("sched");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_generators_valid);
    tcase_add_test(tc, test_generator_exact_order);
    tcase_add_test(tc, test_build_errors);
    tcase_add_test(tc, test_gpipe_bubble);
    tcase_add_test(tc, test_1f1b_makespan);
    tcase_add_test(tc, test_sim_times);
    tcase_add_test(tc, test_format_parse_roundtrip);
    tcase_add_test(tc, test_parse_rejects_junk);
    tcase_add_test(tc, test_csv_roundtrip);
    tcase_add_test(tc, test_csv_torch_style);
    tcase_add_test(tc, test_csv_rejects);
    tcase_add_test(tc, test_validate_b_before_f);
    tcase_add_test(tc, test_validate_missing_send_f);
    tcase_add_test(tc, test_validate_recv_without_send);
    tcase_add_test(tc, test_validate_duplicate_f);
    tcase_add_test(tc, test_validate_wrong_stage);
    tcase_add_test(tc, test_validate_missing_and_partnerless);
    tcase_add_test(tc, test_validate_deadlock);
    tcase_add_test(tc, test_zbh1);
    tcase_add_test(tc, test_validate_split_backward);
    tcase_add_test(tc, test_costs_predict);
    tcase_add_test(tc, test_print_grid);
    tcase_add_test(tc, test_chunks_builders_valid);
    tcase_add_test(tc, test_chunks_bubble);
    tcase_add_test(tc, test_chunks_exact_order);
    tcase_add_test(tc, test_chunks_v1_unchanged);
    tcase_add_test(tc, test_chunks_build_errors);
    tcase_add_test(tc, test_chunks_csv_roundtrip);
    tcase_add_test(tc, test_chunks_invalid_csv);
    tcase_add_test(tc, test_chunks_print_grid);
    tcase_add_test(tc, test_chunks_costs);
    tcase_add_test(tc, test_vshape_builders);
    tcase_add_test(tc, test_place_map);
    tcase_add_test(tc, test_vshape_csv);
    tcase_add_test(tc, test_wait_split);
    tcase_add_test(tc, test_registry_all);
    suite_add_tcase(su, tc);
    return su;
}

/* run everything in-process (CK_NOFORK) and fail the exit code on any failure */

int main(void) {
    SRunner *sr = srunner_create(sched_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
