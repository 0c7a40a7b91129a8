#!/bin/bash
# Prepare what bench/gpu_check.sh needs on the lent GPU machine, which has nvcc and PyTorch but
# no MPICH, OpenBLAS, parallel HDF5, inih or Check, no autotools, and no network:
#   .debs/*.deb         Debian 12 packages (the runtime and -dev packages listed in PKGS below, plus Check,
#                       pkgconf and make in case the machine lacks them), fetched with
#                       `apt-get download` (no install; run `apt-get update` first if it fails);
#   .debs/autotools/    the generated configure, Makefile.in, config.h.in, aclocal.m4 and
#                       build-aux/ (git ignores them; autoreconf may not exist there).
# `/.debs/` is added to .git/info/exclude, so the folder is ignored and travels only when a
# device run names it: run(command="bash bench/gpu_check.sh", carry=[".debs"]).
#
#   bench/get_debs.sh [EXTRA_PACKAGE ...]     (from anywhere in the checkout)
#
# About 40 MB; the device tool carries at most 64 MiB with the working tree.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

PKGS="mpich libmpich12 libmpich-dev libhwloc15 libucx0 libfabric1 libibverbs1 librdmacm1 libpsm2-2
libnuma1 libpmix2 libevent-2.1-7 libevent-pthreads-2.1-7 libopenblas0-pthread
libopenblas-pthread-dev libopenblas-dev libgfortran5 libquadmath0 libhdf5-mpich-103-1
libhdf5-mpich-dev libsz2 libaec0 libinih1 libinih-dev
check libsubunit0 libsubunit-dev
pkgconf pkgconf-bin libpkgconf3 make"

# ignored by git, never committed (.git/info/exclude is not tracked)
gitdir=$(git rev-parse --git-common-dir 2>/dev/null || echo .git)
mkdir -p "$gitdir/info"
grep -qx '/.debs/' "$gitdir/info/exclude" 2>/dev/null || echo '/.debs/' >>"$gitdir/info/exclude"

mkdir -p .debs
(
    cd .debs
    rm -f ./*.deb
    # shellcheck disable=SC2086
    if ! apt-get download $PKGS "$@"; then
        echo "get_debs: apt-get download failed (try: apt-get update)" >&2
        exit 1
    fi
)

# the autotools outputs, so the device needs no autoreconf
if ! [ -x configure ] || ! [ -f Makefile.in ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi
fi
rm -rf .debs/autotools
mkdir -p .debs/autotools
cp -a configure Makefile.in config.h.in aclocal.m4 build-aux .debs/autotools/
sha256sum configure.ac Makefile.am >.debs/autotools/SOURCES.sha256 # gpu_check.sh warns when stale

n=$(ls .debs/*.deb | wc -l)
mb=$(du -sm .debs | cut -f1)
echo "get_debs: $n packages and the autotools outputs in $top/.debs ($mb MB)"
if [ "$mb" -gt 56 ]; then
    echo "get_debs: warning: $mb MB is close to the device tool's 64 MiB (working tree included)" >&2
fi
