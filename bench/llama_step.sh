#!/bin/bash
# Benchmark: one Llama training step of pipelm vs PyTorch, one process, one thread, fp32 and
# bf16 (pipelm --backend onednn --precision bf16; torch bf16 autocast).
#
#   bench/llama_step.sh [PIPELM]      (or PIPELM=... bench/llama_step.sh)
#
# Models: llama-tiny (B=16, T=64) and two blocks of the Llama-3.2-1B shape (llama-1b preset
# with --n-layer 2: V=128256, C=2048, NH=32, NKV=8, H=8192; B=1, T=256; about 9 GB per
# process). pipelm: `pipelm bench` (median step of the timed steps, MFU against the measured
# one-thread matmul peak of the backend in its precision); torch: bench/torch_llama_step.py,
# median after the warm-up, MFU with the same FLOP count against the same peak (measured by
# each pipelm run: on a busy machine it is low and the MFU overstated). A report, not
# a test: it always exits 0. Environment: BENCH_STEPS (default 4), BENCH_WARMUP (default 1),
# LLAMA_BENCH_SKIP_1B=1 skips the large shape.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
PY=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
STEPS=${BENCH_STEPS:-4}
WARMUP=${BENCH_WARMUP:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/llama_step.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# name, pipelm model options, torch options
cases=("tiny|--preset llama-tiny --batch 16 --seq-len 64|--V 256 --C 72 --L 4 --NH 6 --NKV 2 --H 192 --T 64 --B 16")
[ "${LLAMA_BENCH_SKIP_1B:-0}" = 1 ] || cases+=("1b-L2|--preset llama-1b --n-layer 2 --batch 1 --seq-len 256|--V 128256 --C 2048 --L 2 --NH 32 --NKV 8 --H 8192 --T 256 --B 1")

printf '%-7s %-22s %10s %10s %8s\n' model run "step ms" "tok/s" MFU
for c in "${cases[@]}"; do
    IFS='|' read -r name popts topts <<< "$c"
    tokens=$(echo "$popts" | awk '{for (i=1;i<=NF;i++) {if ($i=="--batch") b=$(i+1); if ($i=="--seq-len") t=$(i+1)}} END {print b*t}')
    fpt=""; peak32=""; peak16=""
    for prec in fp32 bf16; do
        be=cpu; [ $prec = bf16 ] && be=onednn
        j=$tmp/p_${name}_$prec.json
        if timeout 1800 "$PIPELM" bench $popts --microbatches 1 --steps $STEPS --warmup $WARMUP --threads 1 \
                --backend $be --precision $prec --json $j > $tmp/p_${name}_$prec.log 2>&1; then
            read -r ms mfu f pk < <("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(d['step_ms']['median'], d['mfu'], d['flops_per_token'], d['peak_gflops'])" $j)
            fpt=$f; [ $prec = fp32 ] && peak32=$pk || peak16=$pk
            printf '%-7s %-22s %10.1f %10.0f %7.1f%%  (peak %s GFLOP/s)\n' $name "pipelm $be $prec" $ms \
                "$(echo "$tokens * 1000 / $ms" | bc -l)" "$(echo "$mfu * 100" | bc -l)" "$pk"
        else
            printf '%-7s %-22s %s\n' $name "pipelm $be $prec" "failed: $(tail -n 1 $tmp/p_${name}_$prec.log)"
        fi
    done
    if ! "$PY" -c 'import torch' > /dev/null 2>&1; then echo "torch not available to $PY: skipped"; continue; fi
    for prec in fp32 bf16; do
        j=$tmp/t_${name}_$prec.json
        flag=""; [ $prec = bf16 ] && flag=--bf16
        if timeout 1800 "$PY" "$here/torch_llama_step.py" $topts $flag --threads 1 --steps $STEPS --warmup $WARMUP \
                --json $j > $tmp/t_${name}_$prec.log 2>&1; then
            ms=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['median_ms'])" $j)
            pk=$peak32; [ $prec = bf16 ] && pk=$peak16
            mfu="-"
            [ -n "$fpt" ] && [ -n "$pk" ] && mfu=$("$PY" -c "import sys; f, n, ms, pk = map(float, sys.argv[1:]); \
print('%.1f%%' % (100 * f * n / (ms / 1e3) / (pk * 1e9)))" "$fpt" "$tokens" "$ms" "$pk")
            printf '%-7s %-22s %10.1f %10.0f %8s\n' $name "torch $prec" $ms "$(echo "$tokens * 1000 / $ms" | bc -l)" "$mfu"
        else
            printf '%-7s %-22s %s\n' $name "torch $prec" "failed: $(tail -n 1 $tmp/t_${name}_$prec.log)"
        fi
    done
done
echo "(MFU: FLOP/token = 6 x (parameters - wte) + 6 L C T, against pipelm's measured 1-thread peak of the"
echo " matmul in that precision: OpenBLAS sgemm for fp32, oneDNN bf16 matmul for bf16)"
exit 0
