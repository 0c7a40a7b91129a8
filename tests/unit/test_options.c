/*
 * test_options.c — the option table read one way by every subcommand that uses it (train,
 * bench, eval, generate, tune; issue 37 item 8): for every option of the table and every one
 * of those subcommands, config_parse (in-process, nothing run) must
 *   - refuse an option the subcommand does not take, by name ("unknown option '--x' for eval");
 *   - refuse a missing value by name (unless the value may be left out: --resume, switches);
 *   - refuse an empty value, given as --name "" or --name=, by name;
 *   - refuse a value taken from the next word when it is an option ("--save-final --resume");
 *   - read --name=value as --name value;
 * and refuse an unknown option by name wherever it stands, before a bad value beside it.
 * The subcommands with their own parsers (schedule, tune, convert; eval's and generate's own
 * options) are driven through the program in tests/integration/test_options.sh.
 */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include "cli/config.h"
#include "util/common.h"

static const char *const cmds[] = {"train", "bench", "eval", "generate", "tune"};

/* parse "pipelm CMD words..." for cmd; PL_OK or the failure, err holding the message */
static int parse(int cmd, char *err, size_t errlen, int n, const char **words) {
    char *argv[16];
    argv[0] = (char *)"pipelm";
    argv[1] = (char *)cmds[cmd];
    for (int i = 0; i < n; i++) argv[2 + i] = (char *)words[i];
    pl_options o;
    config_defaults(&o);
    err[0] = 0;
    return config_parse(&o, 2 + n, argv, 2, cmd, err, errlen);
}

/* the check: rc is a failure and err holds want (or rc is PL_OK when want is NULL) */
static int expect(int cmd, const char *what, const char *want, int n, const char **words) {
    char err[1024];
    int rc = parse(cmd, err, sizeof err, n, words);
    int good = want ? rc != PL_OK && strstr(err, want) != NULL : rc == PL_OK;
    if (!good) fprintf(stderr, "%s %s: rc %d, want %s'%s': %s\n", cmds[cmd], what, rc, want ? "" : "success ",
                       want ? want : "", err);
    return good;
}

/* an option every one of these subcommands takes, other than name: the next word in the checks */
static const char *other(const char *name) {
    return strcmp(name, "seed") == 0 ? "--batch" : "--seed";
}

START_TEST(test_every_option) {
    int failed = 0, checked = 0;
    for (int cmd = 0; cmd < CFG_NCMDS; cmd++) {
        const char *name;
        int taken, optional;
        for (int i = 0; config_option_at(i, cmd, &name, &taken, &optional) == PL_OK; i++) {
            char opt[80], eq[88], want[128];
            snprintf(opt, sizeof opt, "--%s", name);
            if (!taken) {
                snprintf(want, sizeof want, "unknown option '--%s' for %s", name, cmds[cmd]);
                const char *w[] = {opt, "1"};
                failed += !expect(cmd, opt, want, 2, w), checked++;
                continue;
            }
            snprintf(want, sizeof want, "--%s needs a value", name);
            const char *w1[] = {opt};
            failed += !expect(cmd, "(no value)", optional ? NULL : want, 1, w1), checked++;
            const char *w2[] = {opt, other(name), "1"};
            failed += !expect(cmd, "(next word an option)", optional ? NULL : want, 3, w2), checked++;
            snprintf(want, sizeof want, "--%s has an empty value", name);
            const char *w3[] = {opt, ""};
            failed += !expect(cmd, "(empty)", want, 2, w3), checked++;
            snprintf(eq, sizeof eq, "--%s=", name);
            const char *w4[] = {eq};
            failed += !expect(cmd, "(empty after =)", want, 1, w4), checked++;
        }
    }
    ck_assert_msg(checked > 250, "only %d checks: the option table was not read", checked);
    ck_assert_msg(failed == 0, "%d of %d option checks failed (listed on stderr)", failed, checked);
}
END_TEST

/* an unknown option first, in the middle or last is what is reported, not the bad value of
 * the option beside it */
START_TEST(test_unknown_first) {
    for (int cmd = 0; cmd < CFG_NCMDS; cmd++) {
        const char *a[] = {"--nosuch", "1", "--seed", "x"}, *b[] = {"--seed", "x", "--nosuch", "--batch", "2"},
                   *c[] = {"--seed", "", "--nosuch"};
        ck_assert(expect(cmd, "first", "unknown option '--nosuch'", 4, a));
        ck_assert(expect(cmd, "middle", "unknown option '--nosuch'", 5, b));
        ck_assert(expect(cmd, "last", "unknown option '--nosuch'", 3, c));
    }
}
END_TEST

/* --name=value is --name value, a value starting with -- only in that form; a switch bare */
START_TEST(test_forms) {
    char e1[1024], e2[1024];
    const char *a[] = {"--steps=-3", "--lr=--5"}, *b[] = {"--steps", "-3", "--lr=--5"};
    ck_assert_int_eq(parse(CFG_CMD_TRAIN, e1, sizeof e1, 2, a), parse(CFG_CMD_TRAIN, e2, sizeof e2, 3, b));
    ck_assert_str_eq(e1, e2);
    ck_assert_msg(strstr(e1, "'--5' for --lr"), "%s", e1);
    const char *sw[] = {"--ckpt-async", "--steps", "3"}, *sw0[] = {"--ckpt-async", "0"};
    ck_assert(expect(CFG_CMD_TRAIN, "bare switch", NULL, 3, sw));
    ck_assert(expect(CFG_CMD_TRAIN, "switch 0", NULL, 2, sw0));
    const char *sf[] = {"--steps", "3", "--save-final", "--resume"};
    ck_assert(expect(CFG_CMD_TRAIN, "save-final swallowing --resume", "--save-final needs a value", 4, sf));
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_every_option);
    tcase_add_test(tc, test_unknown_first);
    tcase_add_test(tc, test_forms);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return nf == 0 ? 0 : 1;
}
