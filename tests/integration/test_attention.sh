#!/bin/bash
# test_attention.sh — the CPU backend's fused attention (--backend-opt attention=tiled, issue
# 40; src/backend/cpu/cpu_attention.c) in whole training runs, against the (T, T) path it
# replaces (attention=full):
#   - GPT-2 (tiny, T = 300: several query and key tiles, a ragged last one) and Llama
#     (llama-tiny: GQA 6 query / 2 kv heads, head size 12, RoPE): every step's loss within
#     relative 1e-5 of the full path's, every gradient tensor of step 1 within 1e-5 of its
#     largest magnitude (--dump-grads, tests/reference/grads_close.py);
#   - the tiled path's bits: 2 pipeline stages = 1 stage, selective recomputation (the
#     attention recomputed in the backward) = none, run to run; the default (auto at
#     T = 300) is the tiled path bit for bit; the stage table counts the smaller buffer;
#   - the control: tiled and full runs differ in their bits (the comparisons above see the
#     path taken);
#   - the oneDNN backend's tiled path (fp32, bf16): 2 stages with selective recomputation = 1
#     stage bit for bit, losses within 1e-5 (fp32) / 2e-2 (bf16) of its (T, T) path;
#   - a bad value is refused on every rank, naming the choices.
# Op by op (odd T, head sizes, GQA, thread counts): tests/unit/test_attention.c. Every mpiexec
# runs under a timeout; ranks oversubscribe small machines: shapes are tiny, one thread each.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
COMMON="--preset tiny --max-seq-len 320 --seq-len 300 --steps 4 --batch 4 --microbatches 2 --eval-every 0
        --progress 0 --log-every 100 --threads 1"
TILED="--backend-opt attention=tiled"
FULL="--backend-opt attention=full"

# grads TAG REF: step 1's gradients of TAG within 1e-5 of REF's, tensor by tensor
grads() {
    "$PIPELM" convert --to hf "$1.g.bin" "$1.g.safetensors" > /dev/null 2>&1 &&
        "$PIPELM" convert --to hf "$2.g.bin" "$2.g.safetensors" > /dev/null 2>&1 &&
        python3 "$SRC/tests/reference/grads_close.py" "$1.g.safetensors" "$2.g.safetensors" 1e-5
}
# against TAG REF WHAT: losses and gradients of TAG against REF
against() {
    local msg
    if msg=$(close "$1.jsonl" "$2.jsonl" 1e-5); then ok "$3: losses within 1e-5 of the full path ($msg)"
    else bad "$3 losses" "too far from the full path ($msg)"; fi
    if msg=$(grads "$1" "$2"); then ok "$3: every gradient tensor within 1e-5 of its max ($msg)"
    else bad "$3 gradients" "$msg"; fi
}
# same NAME A B: the same final weights and losses, bit for bit
same() {
    if [ -s "$2.bin" ] && cmp -s "$2.bin" "$3.bin" && [ -n "$(losses "$2.jsonl")" ] &&
        [ "$(losses "$2.jsonl")" = "$(losses "$3.jsonl")" ]; then ok "$1"
    else bad "$1" "$2 and $3 differ (weights $(md5sum < "$2.bin" | cut -c1-8) vs $(md5sum < "$3.bin" | cut -c1-8))"; fi
}

# GPT-2: tiled against full
run full 1 $FULL --dump-grads full.g.bin
run tiled 1 $TILED --dump-grads tiled.g.bin && against tiled full "GPT-2 T=300 tiled"
if [ -s tiled.bin ] && [ -s full.bin ] && ! cmp -s tiled.bin full.bin; then
    ok "control: the tiled and full runs differ in their bits (the path is taken)"
else bad "control" "tiled and full runs agree bit for bit, or a run failed: the comparisons prove nothing"; fi
grep -q "attention tiled" tiled.out && ok "the banner names the attention path" || bad "banner" "no 'attention tiled'"
mb() { awk '/act MB/ { getline; print $7; exit }' "$1"; }
if awk -v t="$(mb tiled.out)" -v f="$(mb full.out)" 'BEGIN { exit !(t > 0 && f > 0 && t < 0.6 * f) }'; then
    ok "the stage table counts the tiled buffer: $(mb tiled.out) MB a micro-batch against $(mb full.out)"
else bad "stage table" "act MB tiled $(mb tiled.out), full $(mb full.out)"; fi

# the tiled path's bits: the default (auto), 2 stages, selective recomputation, a rerun
run auto 1 && same "the default at T=300 (attention=auto) is the tiled path, bit for bit" auto tiled
run tiled2 1 $TILED && same "tiled: run to run, bit for bit" tiled2 tiled
run p2 2 $TILED --stages 2 && same "tiled: 2 stages = 1 stage, bit for bit" p2 tiled
run sel 1 $TILED --recompute selective && same "tiled: selective recomputation = none, bit for bit" sel tiled
run p2z 2 $TILED --stages 2 --schedule zb-h1 --microbatches 4 --recompute full
run z1 1 $TILED --microbatches 4 && same "tiled: 2 stages, zb-h1, full recomputation = 1 stage, bit for bit" p2z z1

# Llama: grouped-query attention, RoPE
LL="--preset llama-tiny --max-seq-len 320"
run lfull 1 $LL $FULL --dump-grads lfull.g.bin
run ltiled 1 $LL $TILED --dump-grads ltiled.g.bin && against ltiled lfull "Llama T=300 tiled (GQA 6/2)"
run lp2 2 $LL $TILED --stages 2 && same "Llama tiled: 2 stages = 1 stage, bit for bit" lp2 ltiled

# the oneDNN backend's tiled path (O(T): the CPU's kernels, bf16 products' inputs rounded in
# bf16): its bits over 2 stages and selective recomputation equal 1 stage's, in bf16 where the
# CPU has it and in fp32; bf16 within its tolerance of the (T, T) path's losses
DT="--backend onednn --backend-opt attention=tiled"
for prec in fp32 bf16; do
    if [ $prec = bf16 ] && ! mpirun_t 60 1 train $COMMON --steps 1 --backend onednn --precision bf16 > probe.out 2>&1; then
        echo "note: no bf16 run here: $(grep -m1 error probe.out | cut -c1-160)"
        continue
    fi
    run d1_$prec 1 $DT --precision $prec && run d2_$prec 2 $DT --precision $prec --stages 2 --recompute selective &&
        same "onednn $prec tiled: 2 stages with selective recomputation = 1 stage, bit for bit" d2_$prec d1_$prec
    run df_$prec 1 --backend onednn --backend-opt attention=full --precision $prec
    tol=1e-5; [ $prec = bf16 ] && tol=2e-2
    if msg=$(close d1_$prec.jsonl df_$prec.jsonl $tol); then ok "onednn $prec tiled: losses within $tol of its (T, T) path ($msg)"
    else bad "onednn $prec tiled losses" "$msg"; fi
done

# a bad value: every rank ends with the cause, non-zero
expect "attention=flash is refused, naming the choices" 2 "attention=auto|tiled|full" \
    mpirun_t 60 2 train $COMMON --backend cpu --backend-opt attention=flash --stages 2

finish
