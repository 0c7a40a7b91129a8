#!/bin/bash
# test_llmc_llama.sh — issue 23's llm.c side: an llm.c Llama 3 file in llm.c's own layout
# (written by tests/reference/torch_llama.py from train_llama3.py's write_tensors, independently of
# pipelm) read, converted to a checkpoint and back byte-identical, trained bit-identically on
# 1 and 3 ranks (full tier: 1, 2, 3); a non-zero bias slot refused by name; a tied Llama head
# (Llama 3.2) bit-identical across ranks, its checkpoint resumed on another rank count (full
# tier). Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
SRC=$(cd "$SRC" && pwd)
need_torch
cd "$WORK"
# the plain tier runs 1 and 3 ranks; the full tier adds 2 ranks and the tied resume
if full_tier; then RANKS="1 2 3"; else RANKS="1 3"; fi
COMMON="--steps 3 --batch 4 --seq-len 8 --microbatches 2 --eval-every 0 --progress 0 --log-every 100"

# 1. llm.c's Llama 3 layout, from a writer that is not pipelm's
if [ $TORCH = 1 ]; then
    "$PY" "$SRC/tests/reference/torch_llama.py" --write-model m3.bin --version 3
    if "$PIPELM" convert m3.bin m3.h5 > cv1.out 2>&1 && "$PIPELM" convert m3.h5 m3b.bin > cv2.out 2>&1 \
            && cmp -s m3.bin m3b.bin; then
        ok "llm.c Llama 3 file (train_llama3.py layout) -> checkpoint -> llm.c: byte-identical"
    else bad "llm.c round trip" "$(cat cv1.out cv2.out | tail -n 3 | tr '\n' ' ')"; fi
    # tokens below V = 97 (the test model's vocabulary)
    "$PY" -c "
import numpy as np
h = np.zeros(256, dtype='<i4'); h[:3] = [20240801, 7, 3000]
with open('t.bin', 'wb') as f: h.tofile(f); (np.arange(3000) * 7 % 97).astype('<u4').tofile(f)"
    for P in $RANKS; do
        mpirun_t 120 $P train --init m3.bin --data t.bin $COMMON --save-final r$P.bin --metrics r$P.jsonl \
            > r$P.out 2>&1 || bad "--init m3.bin on $P ranks" "$(tail -n 2 r$P.out | tr '\n' ' ')"
    done
    if cmp -s r1.bin r3.bin && [ "$(losses r1.jsonl)" = "$(losses r3.jsonl)" ] \
            && [ -n "$(losses r1.jsonl)" ]; then
        ok "a model loaded from an llm.c Llama 3 file trains the same bits on 1, 2 and 3 ranks"
    else bad "llm.c init across ranks" "files or losses differ"; fi
    # a non-zero value in a bias slot (slot 11, fcb, layer 1, element 7) is refused by name
    "$PY" - <<'PYEOF'
import numpy as np
raw = bytearray(open("m3.bin", "rb").read())
hi = np.frombuffer(bytes(raw[:1024]), dtype="<i4")
V, L, NH, NKV, C = (int(x) for x in hi[3:8])
HS = C // NH; Q = (NH + 2 * NKV) * HS; H = 208   # torch_llama.py's default_config
sizes = [V*C, V*C, L*C, L*C, L*Q*C, L*Q, L*C*C, L*C, L*C, L*C, L*2*H*C, L*2*H, L*C*H, L*C, C, C]
off = sum(sizes[:11]) + 2 * H + 7
raw[2048 + 4 * off:2048 + 4 * off + 4] = np.float32(0.5).tobytes()
open("bias.bin", "wb").write(bytes(raw))
PYEOF
    mpirun_t 60 1 train --init bias.bin --data t.bin $COMMON > bias.out 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "tensor h.1.fcb holds 0.5 at element 7" bias.out; then
        ok "refused: a non-zero bias slot, named ($(grep -o 'tensor h.1.fcb[^:]*' bias.out | head -n 1))"
    else bad "non-zero bias slot" "rc=$rc $(tail -n 2 bias.out | tr '\n' ' ')"; fi
fi

# 2. a tied Llama head (Llama 3.2's tie_word_embeddings): same bits on 1, 2 and 3 ranks
TIED="--preset llama-tiny --tie-embeddings 1 --use-scaled-rope 1 --rope-scaling-factor 32 $COMMON"
for P in $RANKS; do
    mpirun_t 120 $P train $TIED --save-final tie$P.bin --metrics tie$P.jsonl > tie$P.out 2>&1 \
        || bad "tied run on $P ranks" "$(tail -n 2 tie$P.out | tr '\n' ' ')"
done
if cmp -s tie1.bin tie3.bin && [ "$(losses tie1.jsonl)" = "$(losses tie3.jsonl)" ] \
        && grep -q "tied embedding: the copies on stage 0 and stage 2 are bit-identical" tie3.out \
        && grep -q "NKV=2 .*(scaled x32).* tied" tie1.out; then
    ok "tied Llama head: bit-identical on 1, 2 and 3 ranks, the two copies equal"
else bad "tied Llama" "$(grep -h "tied\|model:" tie*.out | head -n 3 | tr '\n' ' ')"; fi
if full_tier; then
mpirun_t 120 2 train $TIED --ckpt-dir ck --ckpt-every 2 > cka.out 2>&1 || bad "tied save" "$(tail -n 2 cka.out)"
if mpirun_t 120 3 train $TIED --resume ck/ckpt_00000002.h5 --save-final tieb.bin --metrics tieb.jsonl \
        > ckb.out 2>&1 && cmp -s tie1.bin tieb.bin; then
    ok "a tied Llama's checkpoint of 2 ranks resumed on 3: final weights bit-identical"
else bad "tied resume" "$(tail -n 2 ckb.out | tr '\n' ' ')"; fi
"$PIPELM" inspect ck/ckpt_00000002.h5 > insp.out 2>&1
if grep -q "tie_embeddings  *1" insp.out && grep -q "rope_scaling_factor  *32" insp.out \
        && ! grep -q "/model/lm_head" insp.out; then
    ok "inspect: /config/tie_embeddings 1, rope_scaling_factor 32, no lm_head tensor"
else bad "tied inspect" "$(grep -i "tie\|rope\|lm_head" insp.out | tr '\n' ' ')"; fi
mpirun_t 60 1 train --preset llama-tiny --use-scaled-rope 1 --rope-scaling-factor 32 $COMMON \
    --resume ck/ckpt_00000002.h5 > mis.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "tie_embeddings is 1 in the file but 0 in this run" mis.out \
    && ok "refused: a tied checkpoint resumed untied" || bad "tied vs untied resume" "rc=$rc $(tail -n 2 mis.out)"
else full_only "a tied Llama's checkpoint resumed on another rank count"; fi

finish
