#!/bin/bash
# The OpenBLAS kernel: on a CPU that Debian's OpenBLAS does not recognise (it falls back to an
# SSE3 kernel) pipelm re-executes itself once with the best kernel the CPU's features allow;
# an OPENBLAS_CORETYPE set by the user always wins; --blas-auto 0 (or its alias
# PIPELM_BLAS_AUTO=0) keeps the library's own choice. The banner and `bench --peak` say which kernel runs and why.
source "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
# what the library picks on its own, without pipelm
cat > corename.c <<'C'
#include <stdio.h>
char *openblas_get_corename(void);
int main(void) { printf("%s\n", openblas_get_corename()); return 0; }
C
cc corename.c -o corename -lopenblas 2>/dev/null || { bad "build a probe against OpenBLAS" "cc failed"; finish; exit; }
own=$(env -u OPENBLAS_CORETYPE ./corename)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
banner() { env "$@" "$PIPELM" train --steps 1 --progress 0 2>&1 | grep '^BLAS:'; }
b=$(banner -u OPENBLAS_CORETYPE)
case "$own" in
Prescott|Core2|Penryn|Nehalem|Sandybridge|Atom|Unknown)
    case "$flags" in
    *avx512bw*avx512vl*avx512_bf16*|*avx512_bf16*avx512bw*) want=Cooperlake ;;
    *avx512bw*) want=SkylakeX ;;
    *avx2*) want=Haswell ;;
    *) want=$own ;;
    esac ;;
*) want=$own ;;
esac
if echo "$b" | grep -q "kernel $want "; then ok "default: OpenBLAS alone picks $own; pipelm runs $want: $b"
else bad "default kernel" "OpenBLAS alone: $own, expected $want, banner: $b"; fi
b=$(banner OPENBLAS_CORETYPE=Haswell)
if echo "$b" | grep -q "kernel Haswell (OPENBLAS_CORETYPE, set by the user"; then ok "a user's OPENBLAS_CORETYPE wins: $b"
else bad "OPENBLAS_CORETYPE=Haswell" "$b"; fi
b=$(banner -u OPENBLAS_CORETYPE PIPELM_BLAS_AUTO=0)
if echo "$b" | grep -q "kernel $own (detected by OpenBLAS)"; then ok "PIPELM_BLAS_AUTO=0 keeps OpenBLAS's own $own"
else bad "PIPELM_BLAS_AUTO=0" "$b"; fi
b=$(env -u OPENBLAS_CORETYPE "$PIPELM" train --blas-auto 0 --steps 1 --progress 0 2>&1 | grep '^BLAS:')
if echo "$b" | grep -q "kernel $own (detected by OpenBLAS)"; then ok "--blas-auto 0 keeps OpenBLAS's own $own"
else bad "--blas-auto 0" "$b"; fi
# under mpiexec every rank re-executes before MPI starts
b=$(env -u OPENBLAS_CORETYPE timeout 60 "$MPIEXEC" -n 2 "$PIPELM" train --steps 1 --progress 0 2>&1 | grep '^BLAS:')
if echo "$b" | grep -q "kernel $want "; then ok "2 ranks under mpiexec: $want"; else bad "mpiexec kernel" "$b"; fi
p=$(env -u OPENBLAS_CORETYPE "$PIPELM" bench --peak 2>&1)
if echo "$p" | grep -q "OpenBLAS kernel $want"; then ok "bench --peak names the kernel"; else bad "bench --peak" "$p"; fi
finish
