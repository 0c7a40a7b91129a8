#!/bin/bash
# jobs/setup.sh — install what is missing (Debian 12, as root), bootstrap, configure and build
# pipelm in ./build. With --test, also run the test suite's plain tier (make check: every unit,
# multi-rank and reference test, a few minutes on 2 cores) and print the per-test summaries.
# With --test --full (what .ci/run does): the full tier (PIPELM_TEST_FULL=1: the slow checks
# too, docs/testing.md), then the sanitizer stage (the plain tier in ./build-asan, configured
# --enable-sanitizers: every C path the tests reach, without the full tier's larger sizes), the
# fuzz stage (tests/fuzz/run.sh: every fuzz target for FUZZ_SECONDS, default 20 here, in
# ./build-fuzz; longer campaigns by hand: make fuzz), the cuda-emu stage (tests/lib/cuda_emu.sh:
# the CUDA kernels under the host emulation) and the dist stage (make distcheck: the tarball
# builds and its style and unit tests pass). PIPELM_CI_STAGES picks stages (default "tests", or
# "tests sanitizers fuzz cuda-emu dist" with --full); PIPELM_TEST_JOBS tests run at once
# (default 2). docs/testing.md says why each stage covers what it does.
# Exits non-zero if any stage fails; prints each stage's time as it ends, and all of them last.
# PIPELM_BUILD names the build directory instead of build (then BUILD-asan and BUILD-fuzz).
# Safe to run again: installed packages and a configured build are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential autoconf automake libtool autoconf-archive pkg-config mpich libmpich-dev
      libopenblas-dev libopenblas-openmp-dev libhdf5-mpich-dev hdf5-tools libinih-dev check gnuplot-nox
      libdnnl-dev libisal-dev libjansson-dev libpcre2-dev zlib1g-dev"
# tests only: the independent PyTorch reference, h5py to read checkpoints, a local Slurm cluster,
# clang's libFuzzer (with its OpenMP runtime) for the fuzz stage; python3-regex for the
# tokenizer's reference encoder, nodejs for the full tier's (tiktoken, from npm: below)
TEST_PKGS="python3-torch python3-numpy python3-h5py python3-regex nodejs slurm-wlm slurmctld slurmd slurm-client munge
           clang libclang-rt-14-dev libomp-dev"

want=$PKGS
[ "${1:-}" = "--test" ] && want="$PKGS $TEST_PKGS"
missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    t_install=$(date +%s)
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
    printf 'stage %-10s %5d s  ok\n' install $(($(date +%s) - t_install))
fi
# npm: Debian's nodejs comes without it (another build of nodejs may bring its own)
if [ "${1:-}" = "--test" ] && ! command -v npm > /dev/null; then
    DEBIAN_FRONTEND=noninteractive ${SUDO:-$([ "$(id -u)" -ne 0 ] && echo sudo)} apt-get install -y -qq --no-install-recommends npm
fi

# stage_time NAME T0 RC: one line with the stage's time since T0 (date +%s) and its outcome
stage_time() { printf 'stage %-10s %5d s  %s\n' "$1" $(($(date +%s) - $2)) "$([ "$3" -eq 0 ] && echo ok || echo FAILED)"; }

t_build=$(date +%s)
[ -x configure ] && [ configure -nt configure.ac ] && [ configure -nt Makefile.am ] || autoreconf -fi
build=${PIPELM_BUILD:-build}
mkdir -p "$build"
cd "$build"
# the CUDA backend is built wherever the toolkit is (CUDA_HOME, default /usr/local/cuda): a
# machine without a GPU refuses --backend cuda at run time and skips its tests
cuda=${CUDA_HOME:-/usr/local/cuda}
cuda_flag=
[ -x "$cuda/bin/nvcc" ] && [ "${PIPELM_CUDA:-1}" != 0 ] && cuda_flag="--with-cuda=$cuda"
[ -f Makefile ] || ../configure $cuda_flag
make -j"$(nproc)"
times=$(stage_time build "$t_build" 0)$'\n'
printf '%s' "$times"

# logs DIR: the summary lines of each test's log; counts DIR: "N passed, N failed, N skipped"
# over automake's .trs files
logs() {
    local dir=$1 log
    for log in $(find "$dir" -name '*.log' ! -name test-suite.log ! -name config.log | sort); do
        [ -f "${log%.log}.trs" ] || continue
        echo "== $log"
        # Check writes its summary line into each test's log: show them
        grep -E "^[0-9]+%: Checks|passed, [0-9]+ failed|^(FAIL|ERROR|SKIP)|PASS:|FAIL:|inputs$" "$log" || tail -n 5 "$log"
    done
}
counts() {
    local dir=$1 pass fail skip
    # awk, not grep -c: grep exits 1 on a file with no match under pipefail
    pass=$(find "$dir" -name '*.trs' -exec cat {} + | awk '/^:test-result: PASS/ {n++} END {print n + 0}')
    fail=$(find "$dir" -name '*.trs' -exec cat {} + | awk '/^:test-result: (FAIL|ERROR|XPASS)/ {n++} END {print n + 0}')
    skip=$(find "$dir" -name '*.trs' -exec cat {} + | awk '/^:test-result: SKIP/ {n++} END {print n + 0}')
    echo "$pass passed, $fail failed, $skip skipped"
}

if [ "${1:-}" = "--test" ]; then
    status=0
    full=0
    [ "${2:-}" = "--full" ] && full=1
    if [ $full -eq 1 ]; then stages=${PIPELM_CI_STAGES:-tests sanitizers fuzz cuda-emu dist}; else stages=${PIPELM_CI_STAGES:-tests}; fi
    # the full mode runs the tests' full tier (docs/testing.md), in both test stages
    [ $full -eq 1 ] && export PIPELM_TEST_FULL=1
    # tests at once: each works in its own directory, shares no file or port (docs/testing.md)
    jobs=${PIPELM_TEST_JOBS:-2}
    top=$(dirname "$(pwd)") # we are in $build/
    asan=$top/$build-asan
    for stage in $stages; do
        t0=$(date +%s)
        rc=0
        case $stage in
        tests)
            make -j"$jobs" check || rc=$?
            [ $rc -eq 0 ] || { echo "setup: make check failed"; cat test-suite.log || true; }
            logs tests
            echo "tests: $(counts tests)"
            ;;
        sanitizers)
            # the whole suite again, built with ASan + UBSan; every report fails it
            (mkdir -p "$asan" && cd "$asan" &&
                { [ -f Makefile ] || ../configure --enable-sanitizers; } && make -j"$(nproc)") || rc=$?
            if [ $rc -eq 0 ]; then
                (cd "$asan" && PIPELM_TEST_FULL=${PIPELM_SAN_FULL:-0} make -j"$jobs" check) || rc=$?
                [ $rc -eq 0 ] || { echo "setup: sanitizer make check failed"; cat "$asan/test-suite.log" || true; }
                for r in $(find "$asan/tests" -name '*.san.*' -type f | sort); do
                    echo "== sanitizer report $r"; cat "$r"; rc=1
                done
            fi
            logs "$asan/tests"
            echo "sanitizer tests: $(counts "$asan/tests")"
            ;;
        fuzz)
            FUZZ_SECONDS=${FUZZ_SECONDS:-20} FUZZ_BUILD="$top/$build-fuzz" "$top/tests/fuzz/run.sh" || rc=$?
            ;;
        cuda-emu)
            # the CUDA backend's kernels under the host emulation (no GPU needed): test_cuda's
            # plain cases and the conformance test, ASan + UBSan (the full-tier sizes take
            # many more minutes: run them by hand with PIPELM_TEST_FULL=1)
            PIPELM_TEST_FULL=0 "$top/tests/lib/cuda_emu.sh" . || rc=$?
            ;;
        dist)
            # the release tarball: complete (dist-hook refuses a file missing from Makefile.am),
            # builds out of tree and read-only, and its style and unit tests pass
            make distcheck DISTCHECK_CONFIGURE_FLAGS= \
                TESTS="tests/unit/test_style.sh tests/unit/test_sched tests/unit/test_model tests/unit/test_crc" || rc=$?
            ;;
        *) echo "setup: unknown stage '$stage' in PIPELM_CI_STAGES"; rc=1 ;;
        esac
        [ $rc -eq 0 ] || status=1
        line=$(stage_time "$stage" "$t0" $rc)
        echo "$line"
        times="$times$line"$'\n'
    done
    printf '%s' "$times"
    exit $status
fi
