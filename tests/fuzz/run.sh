#!/bin/bash
# tests/fuzz/run.sh — build pipelm's fuzz targets with clang's libFuzzer (+ ASan, UBSan) and
# run each for a bounded time over its committed seed corpus (tests/fuzz/corpus/<target>/).
#
#   tests/fuzz/run.sh [TARGET...]           fuzz each target FUZZ_SECONDS (default 60) seconds
#   tests/fuzz/run.sh --replay [TARGET...]  only run every committed corpus input once
#   tests/fuzz/run.sh --build [TARGET...]   only build
# Targets: llmc tokens ini cli sched ckpt config safetensors costs (default: all). Environment: FUZZ_SECONDS,
# FUZZ_BUILD (build directory, default ./build-fuzz at the top of the tree), FUZZ_CC (clang),
# FUZZ_JOBS (parallel compiles, default 2), FUZZ_ARGS (more libFuzzer flags).
# Fails (non-zero) if any target crashes, hangs (-timeout=10), leaks, runs out of memory
# (-rss_limit_mb=2048) or trips a sanitizer; the input is then left in
# $FUZZ_BUILD/artifacts/: fix the bug and copy the input into the target's corpus.
# New inputs libFuzzer finds go to $FUZZ_BUILD/corpus/<target>/, not into the source tree.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
mode=fuzz
case "${1:-}" in --replay) mode=replay; shift ;; --build) mode=build; shift ;; esac
all="llmc tokens ini cli sched ckpt config safetensors costs bpe"
targets=${*:-$all}
out=${FUZZ_BUILD:-$top/build-fuzz}
secs=${FUZZ_SECONDS:-60}
cc=${FUZZ_CC:-clang}
jobs=${FUZZ_JOBS:-2}
command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (apt-get install clang libclang-rt-14-dev libomp-dev)"; exit 1; }
for t in $targets; do
    case " $all " in *" $t "*) ;; *) echo "fuzz: unknown target '$t' (known: $all)"; exit 1 ;; esac
done

version=$(sed -n 's/^AC_INIT(\[pipelm\], \[\([^]]*\)\].*/\1/p' "$top/configure.ac")
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cflags=(-g -O1 -fopenmp -Wno-pass-failed $san "-DPACKAGE_VERSION=\"${version:-0}\"" -I"$top/src" -I"$top/include" -I"$top/tests/fuzz"
        $(pkg-config --cflags openblas hdf5-mpich inih jansson libpcre2-8 mpich))
libs="$(pkg-config --libs hdf5-mpich inih jansson libpcre2-8 zlib openblas mpich) -lm"
mkdir -p "$out/obj" "$out/artifacts" "$out/corpus"

# the library, without main.c, compiled once with coverage instrumentation (fuzzer-no-link):
# the core sources only (the optional backends, added under `if`, are not parsers of input)
srcs=$(sed -n '/^libpipelm_a_SOURCES =/,/^[^\t]/p' "$top/Makefile.am" | grep -oE 'src/[a-z0-9_/]+\.c( |$)')
build_start=$(date +%s)
stale=""
objs=()
for s in $srcs; do
    o="$out/obj/$(basename "$s" .c).o"
    objs+=("$o")
    [ -f "$o" ] && [ "$o" -nt "$top/$s" ] && [ -z "$(find "$top/include" "$top/src" -newer "$o" -name "*.h" | head -n 1)" ] || stale="$stale $s"
done
if [ -n "$stale" ]; then
    echo "fuzz: compiling$stale"
    n=0
    for s in $stale; do
        "$cc" "${cflags[@]}" -fsanitize=fuzzer-no-link -c "$top/$s" -o "$out/obj/$(basename "$s" .c).o" &
        n=$((n + 1))
        [ $((n % jobs)) -ne 0 ] || wait -n || { wait; echo "fuzz: compile failed"; exit 1; }
    done
    while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || { wait; echo "fuzz: compile failed"; exit 1; }; done
fi
for t in $targets; do
    src="$top/tests/fuzz/fuzz_$t.c"
    bin="$out/fuzz_$t"
    if ! [ -x "$bin" ] || [ "$src" -nt "$bin" ] || [ "$top/tests/fuzz/fuzz.h" -nt "$bin" ] ||
        [ -n "$(find "$out/obj" -newer "$bin" -name '*.o' | head -n 1)" ]; then
        # shellcheck disable=SC2086
        "$cc" "${cflags[@]}" -fsanitize=fuzzer "$src" "${objs[@]}" $libs -o "$bin"
    fi
done
echo "fuzz: built in $(($(date +%s) - build_start)) s into $out"
[ "$mode" = build ] && exit 0

# sanitizer options: leaks count as failures (libFuzzer checks each input), UB aborts
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$top/tests/lib/ubsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$top/tests/lib/lsan.supp:print_suppressions=0}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
summary=""
for t in $targets; do
    bin="$out/fuzz_$t"
    seeds="$top/tests/fuzz/corpus/$t"
    log="$out/fuzz_$t.log"
    start=$(date +%s)
    rc=0
    if [ "$mode" = replay ]; then
        # every committed input once, as files (libFuzzer runs them and exits)
        # shellcheck disable=SC2046
        timeout -k 5 600 "$bin" -timeout=10 -rss_limit_mb=2048 $(find "$seeds" -type f | sort) >"$log" 2>&1 || rc=$?
        execs=$(grep -c '^Executed ' "$log" || true)
    else
        rm -f "$out/artifacts/$t-"*
        work="$out/corpus/$t"
        mkdir -p "$work"
        # shellcheck disable=SC2086
        timeout -k 10 $((secs + 120)) "$bin" "$work" "$seeds" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" ${FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    fi
    secs_used=$(($(date +%s) - start))
    if [ "$rc" -eq 0 ]; then
        verdict=ok
    else
        verdict="FAIL (exit $rc)"
        status=1
        echo "== fuzz_$t: last lines of $log"
        grep -E "ERROR|runtime error|SUMMARY|Test unit written|leak|timeout|out-of-memory" "$log" | head -n 20 || tail -n 30 "$log"
    fi
    line=$(printf 'fuzz %-7s %-16s %6s s  %10s executions' "$t" "$verdict" "$secs_used" "${execs:-?}")
    echo "$line"
    summary="$summary$line"$'\n'
done
echo "== fuzz summary ($mode)"
printf '%s' "$summary"
ls "$out"/artifacts/ 2>/dev/null | sed 's/^/artifact: /' || true
exit $status
