/*
 * fuzz_ini.c — the --config INI file (src/cli/config.c through inih): the input is the file,
 * given as `--config FILE`; what parses is then validated and written as the metrics JSON.
 */
#include "fuzz.h"
#include "cli/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("config.ini");
    fuzz_write_file(path, data, size);
    char a0[] = "--config", a1[256];
    snprintf(a1, sizeof a1, "%s", path);
    char *argv[] = {a0, a1, NULL};
    static pl_options o;
    char err[1024];
    config_defaults(&o);
    if (config_parse(&o, 2, argv, 0, 1, err, sizeof err) == 0) {
        config_validate(&o, err, sizeof err);
        FILE *devnull = fopen("/dev/null", "w");
        config_write_json(&o, devnull);
        fclose(devnull);
    }
    unlink(path);
    return 0;
}
