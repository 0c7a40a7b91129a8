#!/bin/bash
# Run tests/unit/test_cuda.c (and tests/unit/test_backends.c, the conformance test) against
# src/backend/cuda/backend_cuda.cu compiled for the host with the CUDA
# emulation of tests/unit/cuda_emu.h (every kernel thread a real thread, cuBLAS as loops, device
# memory as NaN-filled host memory), under AddressSanitizer and UBSan. For a machine without a
# GPU: it checks the kernels' indexing, barriers and reductions, the row-major -> cuBLAS
# mapping, staging and error paths, and the test itself; not speed, not the real cuBLAS/CUB.
#
#   tests/lib/cuda_emu.sh [BUILD_DIR]    (a configured build: its config.h; default ./build)
#   CUDA_EMU_SRC=FILE: test another copy of backend_cuda.cu (mutation checks of the test)
#
# Runs twice: EMU_NDEV=0 (no driver: must exit 77) and EMU_NDEV=1 (must pass). Needs g++ with
# C++20 (std::barrier), mpicc, Check, OpenBLAS. Takes a few minutes (thousands of threads per
# launch); PIPELM_TEST_FULL=1 adds test_cuda's full-tier real-size cases (attention at T = 1024:
# several more minutes). Not part of `make check`: the cuda-emu stage of
# `./jobs/setup.sh --test --full` (.ci/run) runs it with the plain cases.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/cuda_emu.XXXXXX")
trap 'rm -rf "$out"' EXIT
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
blas_cflags=$(pkg-config --cflags openblas)
blas_libs=$(pkg-config --libs openblas)

set -x
g++ -std=c++20 -O1 -g -Wall -Wextra -Wno-unknown-pragmas $san -pthread -DPIPELM_CUDA_EMU -include "$top/tests/unit/cuda_emu.h" \
    -x c++ -I"$top/src" -I"$top/include" -c "${CUDA_EMU_SRC:-$top/src/backend/cuda/backend_cuda.cu}" -o "$out/backend_cuda.o"
# the registry with the cuda backend only (not the build's config.h: it may name others)
mpicc -std=gnu11 -O1 -g $san -DHAVE_CUDA -I"$top/src" -I"$top/include" -c "$top/src/backend/backend.c" -o "$out/backend.o"
# the host sources the backends need (the CPU backend takes its decode kernels from cpu_decode.c,
# its fused attention from cpu_attention.c)
for f in src/backend/backend_opts.c src/util/hooks.c src/backend/cpu/backend_cpu.c src/backend/cpu/cpu_attention.c src/backend/cpu/cpu_moe.c src/backend/backend_host.c src/backend/cpu/blas.c src/backend/cpu/cpu_decode.c src/backend/cuda/backend_cuda_load.c; do
    mpicc -std=gnu11 -O1 -g $san -fopenmp -DHAVE_CONFIG_H -I"$build" -I"$top/src" -I"$top/include" $blas_cflags \
        -c "$top/$f" -o "$out/$(basename "$f" .c).o"
done
for t in test_cuda test_backends; do
    mpicc -std=gnu11 -O1 -g -Wall -Wextra $san $(pkg-config --cflags check) -I"$top/src" -I"$top/include" \
        -c "$top/tests/unit/$t.c" -o "$out/$t.test.o"
done
mkdir "$out/lib" && mv "$out"/*.o "$out/lib/"
for t in test_cuda test_backends; do
    mpicc $san -fopenmp -pthread -o "$out/${t}_emu" "$out"/lib/backend*.o "$out/lib/hooks.o" "$out/lib/blas.o" "$out/lib/cpu_decode.o" "$out/lib/cpu_attention.o" "$out/lib/cpu_moe.o" "$out/lib/$t.test.o" \
        $blas_libs $(pkg-config --libs check) -lstdc++ -lm
done
set +x

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CK_FORK=no
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
rc=0
EMU_NDEV=0 "$out/test_cuda_emu" || rc=$?
if [ "$rc" != 77 ]; then echo "cuda_emu: EMU_NDEV=0 (no driver): exit $rc, want 77"; exit 1; fi
echo "cuda_emu: EMU_NDEV=0: skipped as it should (77)"
rc=0
EMU_NDEV=1 TEST_CUDA_VERBOSE=${TEST_CUDA_VERBOSE:-0} "$out/test_cuda_emu" || rc=$?
if [ "$rc" != 0 ]; then echo "cuda_emu: EMU_NDEV=1: exit $rc"; exit 1; fi
echo "cuda_emu: EMU_NDEV=1: passed"
# the conformance test: with no device only cpu runs (77); with one, cuda against cpu
rc=0
EMU_NDEV=0 "$out/test_backends_emu" || rc=$?
if [ "$rc" != 77 ]; then echo "cuda_emu: test_backends, EMU_NDEV=0: exit $rc, want 77"; exit 1; fi
rc=0
EMU_NDEV=1 TEST_BACKENDS_VERBOSE=${TEST_CUDA_VERBOSE:-0} "$out/test_backends_emu" || rc=$?
if [ "$rc" != 0 ]; then echo "cuda_emu: test_backends, EMU_NDEV=1: exit $rc"; exit 1; fi
echo "cuda_emu: test_backends: passed"
