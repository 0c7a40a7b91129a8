#!/bin/sh
# tests/lib/san_wrap.sh — SH_LOG_COMPILER of a ./configure --enable-sanitizers build: runs a shell
# test with bash, unless it is named in SAN_SKIP_TESTS (Makefile.am), which it reports as
# skipped (exit 77) with the reason. `make check SAN_SKIP_TESTS=` runs every test.
#
# Nothing is skipped by default: CI runs the whole make check under the sanitizers
# (tests/integration/test_slurm.sh included, about 80 s). SAN_SKIP_TESTS="tests/integration/test_slurm.sh" is a local
# shortcut for iterating, never a CI setting.
name=$(basename "$1")
for t in $SAN_SKIP_TESTS; do
    if [ "$(basename "$t")" = "$name" ]; then
        echo "SKIP: $name under the sanitizers (see tests/lib/san_wrap.sh; make check SAN_SKIP_TESTS= runs it)"
        exit 77
    fi
done
exec bash "$@"
