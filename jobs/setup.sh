#!/bin/bash
# jobs/setup.sh — install what is missing (Debian 12, as root), bootstrap, configure and build
# pipelm in ./build. With --test, also run the whole test suite (make check) and print the
# per-test summaries. Safe to run again: installed packages and a configured build are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential autoconf automake libtool autoconf-archive pkg-config mpich libmpich-dev
      libopenblas-dev libhdf5-mpich-dev hdf5-tools libinih-dev check gnuplot-nox"
# tests only: the independent PyTorch reference, h5py to read checkpoints, a local Slurm cluster
TEST_PKGS="python3-torch python3-numpy python3-h5py slurm-wlm slurmctld slurmd slurm-client munge"

want=$PKGS
[ "${1:-}" = "--test" ] && want="$PKGS $TEST_PKGS"
missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

[ -x configure ] && [ configure -nt configure.ac ] && [ configure -nt Makefile.am ] || autoreconf -fi
mkdir -p build
cd build
[ -f Makefile ] || ../configure
make -j"$(nproc)"

if [ "${1:-}" = "--test" ]; then
    status=0
    make -j1 check || status=$?
    # Check writes its summary line into each test's log: show them
    for log in tests/*.log; do
        [ "$(basename "$log")" = test-suite.log ] && continue
        echo "== $log"
        grep -E "^[0-9]+%: Checks|passed, [0-9]+ failed|^(FAIL|ERROR|SKIP)|PASS:|FAIL:" "$log" || tail -n 5 "$log"
    done
    [ $status -eq 0 ] || { echo "setup: make check failed"; cat tests/test-suite.log || true; }
    # one closing line over all test programs, from automake's own summary
    pass=$(awk '/^:test-result: PASS/ {n++} END {print n + 0}' tests/*.trs)
    fail=$(awk '/^:test-result: (FAIL|ERROR|XPASS)/ {n++} END {print n + 0}' tests/*.trs)
    skip=$(awk '/^:test-result: SKIP/ {n++} END {print n + 0}' tests/*.trs)
    echo "tests: $pass passed, $fail failed, $skip skipped"
    exit $status
fi
