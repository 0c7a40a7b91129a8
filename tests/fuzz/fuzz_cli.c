/*
 * fuzz_cli.c — the command line (config_parse in src/cli/config.c). The input after its first
 * byte is split on NUL bytes into argv; the first byte picks the subcommand whose part of the
 * option table is read (train, bench, eval, generate, tune: CFG_CMD_*).
 * Arguments naming --config are dropped (a fuzzed path could name /dev/stdin or a FIFO; the
 * INI file itself is fuzz_ini's job), so only the flag parser is exercised.
 */
#include "fuzz.h"
#include "cli/config.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int cmd = data[0] % CFG_NCMDS;
    char *buf = malloc(size); /* argv strings: the input with a NUL appended */
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *argv[MAX_ARGS + 1], *p = buf, *end = buf + size - 1;
    int argc = 0;
    while (argc < MAX_ARGS) {
        if (strstr(p, "config") == NULL) argv[argc++] = p;
        p += strlen(p) + 1;
        if (p > end) break;
    }
    argv[argc] = NULL;
    static pl_options o;
    char err[1024];
    config_defaults(&o);
    if (config_parse(&o, argc, argv, 0, cmd, err, sizeof err) == 0) {
        config_validate(&o, err, sizeof err);
        FILE *devnull = fopen("/dev/null", "w");
        config_write_json(&o, devnull);
        fclose(devnull);
    }
    free(buf);
    return 0;
}
