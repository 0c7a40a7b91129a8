#!/bin/bash
# test_generate.sh — `pipelm generate`: greedy decoding through the pipeline with a KV cache
# per stage gives the same tokens on 1, 2, 3 and 4 ranks, with chunks per rank, with chunked
# prefill and several groups, and equals a decode that recomputes the whole prefix every step
# (--kv-cache 0; logits within 1e-5); GPT-2 and Llama agree with an independent PyTorch decode
# (tests/reference/torch_generate.py: 20 tokens, logits within 1e-4); seeded sampling is reproducible and
# the same on every P; the end-of-text id stops a sequence; llm.c tokenizer files (versions 1
# and 2) decode to text; the oneDNN backend (fp32, bf16) decodes as the cpu one does; bad input
# is refused by name.
. "$(dirname "$0")/../lib/lib.sh"
top=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
printf '1,2,3\n5 6 7 8 9 10 11 12 13\n10\n200,100\n' > p.txt
mpirun_t 120 1 train --steps 30 --progress 0 --log-every 100 --save-final w.bin > tr.out 2>&1 || bad "train" "exit $?"
mpirun_t 120 1 train --preset llama-tiny --steps 20 --progress 0 --log-every 100 --save-final wl.bin > trl.out 2>&1 \
    || bad "train llama" "exit $?"
G="--prompt-file p.txt --max-new-tokens 12"

# gen NAME RANKS ARGS...: generate into NAME.tok / NAME.log
gen() {
    local n=$1 r=$2
    shift 2
    mpirun_t 120 "$r" generate $G --tokens-out "$n.tok" "$@" > "$n.log" 2>&1 || bad "$n" "exit $? $(tail -3 "$n.log")"
}
for M in w wl; do
    gen ref_$M 1 --init $M.bin
    [ "$(wc -l < ref_$M.tok)" = 4 ] && [ "$(head -1 ref_$M.tok | tr ',' '\n' | wc -l)" = 12 ] \
        && ok "$M: --tokens-out has one line per prompt, 12 ids each" || bad "$M tokens-out" "$(cat ref_$M.tok)"
    for P in 2 3 4; do
        gen p${P}_$M $P --init $M.bin --prefill-chunk 4
        cmp -s ref_$M.tok p${P}_$M.tok && ok "$M: greedy on P=$P (prefill chunks of 4) = one rank" \
            || bad "$M P=$P" "$(paste -d' ' ref_$M.tok p${P}_$M.tok | head -2)"
    done
    gen ch_$M 2 --init $M.bin --chunks-per-rank 2 --groups 3
    cmp -s ref_$M.tok ch_$M.tok && ok "$M: --chunks-per-rank 2, 3 groups on 2 ranks = one rank" || bad "$M chunks" "differ"
    gen ch3_$M 2 --init $M.bin --chunks-per-rank 3 --groups 1
    cmp -s ref_$M.tok ch3_$M.tok && ok "$M: 3 chunks per rank, one group (empty items keep the rounds) = one rank" \
        || bad "$M chunks 3" "differ"
    gen cl_$M 1 --init $M.bin --logits-out cl_$M.lg
    gen nc_$M 2 --init $M.bin --kv-cache 0 --logits-out nc_$M.lg
    if cmp -s ref_$M.tok nc_$M.tok && awk -F, 'NR == FNR { for (i = 4; i <= NF; i++) a[$1 "," $2 "," i] = $i; next }
        { for (i = 4; i <= NF; i++) { d = $i - a[$1 "," $2 "," i]; if (d < 0) d = -d; if (d > m) m = d }; n++ }
        END { printf "%g\n", m; exit !(n == 48 && m <= 1e-5) }' cl_$M.lg nc_$M.lg > d_$M.txt
    then ok "$M: the cached decode = recomputing the prefix every step (logits within $(cat d_$M.txt))"
    else bad "$M no cache" "$(cat d_$M.txt) $(paste -d' ' ref_$M.tok nc_$M.tok | head -2)"; fi
done

# the oneDNN backend, fp32 and bf16: for each, the same tokens on 1 and 2 ranks; fp32's logits
# within 1e-4 of the cpu backend's and its greedy tokens the same; bf16's logits within 0.1 of
# them (its products of few rows, decode's, take the CPU's fp32 kernel, matmul_decode_fwd, so
# on this small model they come out far closer than that)
# lgdiff A B: the largest difference of two --logits-out files of 4 prompts x 12 tokens
lgdiff() {
    awk -F, 'NR == FNR { for (i = 4; i <= NF; i++) a[$1 "," $2 "," i] = $i; next }
        { for (i = 4; i <= NF; i++) { d = $i - a[$1 "," $2 "," i]; if (d < 0) d = -d; if (d > m) m = d }; n++ }
        END { printf "%g\n", m; exit !(n == 48) }' "$1" "$2"
}
for prec in fp32 bf16; do
    gen dn1_$prec 1 --init w.bin --backend onednn --precision $prec --logits-out dn1_$prec.lg
    gen dn2_$prec 2 --init w.bin --backend onednn --precision $prec
    tol=$([ $prec = fp32 ] && echo 1e-4 || echo 0.1)
    d=$(lgdiff cl_w.lg dn1_$prec.lg)
    if cmp -s dn1_$prec.tok dn2_$prec.tok && awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d != "" && d <= t) }' &&
        { [ $prec = bf16 ] || cmp -s ref_w.tok dn1_$prec.tok; }; then
        ok "onednn $prec: the same tokens on 1 and 2 ranks; logits within $d of the cpu backend's (limit $tol)"
    else bad "onednn $prec" "logits differ by '$d' (limit $tol); $(paste -d' ' dn1_$prec.tok dn2_$prec.tok | head -2)"; fi
done

# seeded sampling: reproducible, and the same on every P (a stream per sequence and position)
S="--init w.bin --temperature 0.9 --top-k 40 --top-p 0.95 --seed 5"
gen s1 1 $S; gen s1b 1 $S; gen s3 3 $S --groups 2
cmp -s s1.tok s1b.tok && cmp -s s1.tok s3.tok && ! cmp -s s1.tok ref_w.tok \
    && ok "seeded sampling: reproducible, the same on P=3 with 2 groups, not the greedy tokens" || bad "sampling" "differ"
gen s9 1 --init w.bin --temperature 0.9 --top-k 40 --top-p 0.95 --seed 9
! cmp -s s1.tok s9.tok && ok "another --seed draws other tokens" || bad "seed" "same tokens"

# the end-of-text id stops a sequence (the third greedy token of prompt 0 as the id)
eot=$(head -1 ref_w.tok | cut -d, -f3)
gen eot 2 --init w.bin --eot-token "$eot"
[ "$(head -1 eot.tok)" = "$(head -1 ref_w.tok | cut -d, -f1-3)" ] && ok "--eot-token stops at that id (kept as the last)" \
    || bad "eot" "$(head -1 eot.tok)"

# llm.c tokenizer files: version 2 (with its end-of-text id) and version 1; text output
/usr/bin/python3 - <<'PY'
import struct
for ver in (1, 2):
    h = [20240328, ver, 256, 255 if ver == 2 else 0] + [0] * 252
    with open("tok%d.bin" % ver, "wb") as f:
        f.write(struct.pack("<256I", *h))
        for i in range(256):
            b = ("<%d>" % i).encode() if i != 65 else b"A"
            f.write(bytes([len(b)]) + b)
with open("bad.bin", "wb") as f:
    f.write(struct.pack("<256I", *([20240328, 2, 50257, 50256] + [0] * 252)))
PY
mpirun_t 60 1 generate --init w.bin --prompt-tokens 65,1 --max-new-tokens 3 --tokenizer tok2.bin > t2.out 2>&1
grep -q "A<1>" t2.out && ok "a version-2 tokenizer file decodes the prompt and the tokens as text" || bad "tok2" "$(tail -3 t2.out)"
mpirun_t 60 2 generate --init w.bin --prompt-tokens 65 --max-new-tokens 2 --tokenizer tok1.bin > t1.out 2>&1
grep -q "^\[0\] A" t1.out && ok "a version-1 tokenizer file on 2 ranks" || bad "tok1" "$(tail -3 t1.out)"

# the PyTorch reference: GPT-2 and Llama (GQA) of odd shapes, 20 greedy tokens and their logits
if out=$(OMP_NUM_THREADS=1 /usr/bin/python3 "$top/tests/reference/torch_generate.py" --pipelm "$PIPELM" --mpiexec "$MPIEXEC" \
         --ranks "$(full_tier && echo 1,2,3 || echo 2)" 2>&1); then ok "torch_generate.py: $(echo "$out" | grep -c '^ok') cases against PyTorch"
else bad "torch_generate.py" "$(echo "$out" | grep -v '^ok' | head -5)"; fi

# Ctrl-C: SIGINT to mpiexec (forwarded to every rank) ends the run after the steps in flight,
# the tokens so far printed and written, every rank exits 75 (a long decode: random weights, 2048 positions)
/usr/bin/python3 -c "print('\n'.join(','.join(str((7 * i + 13 * j) % 256) for j in range(8)) for i in range(16)))" > p16.txt
"$MPIEXEC" -n 2 "$PIPELM" generate --max-seq-len 2048 --prompt-file p16.txt --max-new-tokens 2000 --tokens-out int.tok \
    > int.out 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^pipeline:" int.out && break; sleep 0.2; done
sleep 0.5
kill -INT "$pid"
( sleep 60; kill -9 "$pid" 2>/dev/null ) & guard=$!
wait "$pid"
rc=$?
kill "$guard" 2>/dev/null
# (hydra's own status after forwarding a SIGINT is 75 or 0, as test_faults.sh notes)
if { [ $rc -eq 75 ] || [ $rc -eq 0 ]; } && grep -q "stopped by a signal" int.out && [ "$(wc -l < int.tok)" = 16 ]; then
    ok "SIGINT stops generation cleanly on every rank (exit 75, $(tr ',' '\n' < int.tok | grep -c .) tokens kept)"
else bad "SIGINT" "exit $rc $(tail -2 int.out)"; fi

expect "a token at or above the vocabulary is refused by name" 2 "token 256 (position 1) is not below the vocabulary" \
    mpirun_t 60 2 generate --init w.bin --prompt-tokens 1,256
expect "a prompt longer than max_seq_len is refused" 2 "more than the model's max_seq_len 64" \
    mpirun_t 60 1 generate --init w.bin --prompt-tokens "$(seq -s, 1 65)"
expect "a tokenizer of another vocabulary is refused" 1 "does not match the model" \
    mpirun_t 60 1 generate --init w.bin --prompt-tokens 1 --tokenizer bad.bin
expect "no prompt is refused" 2 "no prompt" "$PIPELM" generate --init w.bin
expect "a bad id is refused" 2 "not a token id" "$PIPELM" generate --prompt-tokens 1,x
expect "--dp is refused" 2 "one pipeline" mpirun_t 60 2 generate --init w.bin --prompt-tokens 1 --dp 2
finish
