#!/bin/bash
# test_hf.sh — Hugging Face models in and out (issue 23): HF-written Llama (q/k permuted for
# rotate-half, sharded F32, tied BF16) and GPT-2 (Conv1D, prefix, F16; full tier) against the
# torch references; the same bits on 1 and 3 ranks; every malformed input refused by name;
# export round trips byte-identical in the tensors, shards with an index, --save-final
# FILE.safetensors across ranks. The files are written by tests/reference/st_write.py, independently of
# pipelm. Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
SRC=$(cd "$SRC" && pwd)
need_torch
cd "$WORK"
# the plain tier runs 1 and 3 ranks; the full tier adds 2 ranks and the GPT-2 F16 reference
if full_tier; then RANKS="1 2 3"; else RANKS="1 3"; fi
COMMON="--steps 3 --batch 4 --seq-len 8 --microbatches 2 --eval-every 0 --progress 0 --log-every 100"

# 3. Hugging Face models in: losses and gradients against the torch references (Llama with
# q/k permuted for rotate-half, sharded F32 and tied BF16; GPT-2 with Conv1D transposed, the
# transformer. prefix, attn.bias masks and lm_head ignored, F16), 5 AdamW steps within 1e-4
if [ $TORCH = 1 ]; then
    if timeout -k 5 300 "$PY" "$SRC/tests/reference/torch_llama.py" --pipelm "$PIPELM" --only-hf > tl.out 2>&1; then
        ok "Hugging Face Llama (sharded F32; tied BF16) matches the torch reference: $(grep -c PASS tl.out) cases"
    else bad "Hugging Face Llama vs torch" "$(grep -A6 '^FAIL' tl.out | tr '\n' ' ' | cut -c1-500)"; fi
    if ! full_tier; then full_only "Hugging Face GPT-2 (F16) against the torch reference"
    elif timeout -k 5 300 "$PY" "$SRC/tests/reference/torch_ref.py" --pipelm "$PIPELM" --hf-dtype F16 --hf-prefix > tg.out 2>&1; then
        ok "Hugging Face GPT-2 (F16, transformer. prefix, masks) matches the torch reference"
    else bad "Hugging Face GPT-2 vs torch" "$(grep -A6 '^FAIL' tg.out | tr '\n' ' ' | cut -c1-500)"; fi
    # the same bits on 1, 2 and 3 ranks from a Hugging Face directory
    "$PY" "$SRC/tests/reference/torch_llama.py" --write-hf hfl --hf-dtype BF16 --tied
    "$PY" -c "
import numpy as np
h = np.zeros(256, dtype='<i4'); h[:3] = [20240801, 7, 3000]
with open('t53.bin', 'wb') as f: h.tofile(f); (np.arange(3000) * 7 % 53).astype('<u4').tofile(f)"
    for P in $RANKS; do
        mpirun_t 120 $P train --init hfl --data t53.bin $COMMON --save-final h$P.bin --metrics h$P.jsonl \
            > h$P.out 2>&1 || bad "--init hfl on $P ranks" "$(tail -n 2 h$P.out | tr '\n' ' ')"
    done
    if cmp -s h1.bin h3.bin && [ "$(losses h1.jsonl)" = "$(losses h3.jsonl)" ] \
            && [ -n "$(losses h1.jsonl)" ] && grep -q "(scaled x32).* tied" h1.out; then
        ok "a tied Llama from Hugging Face BF16 files trains the same bits on 1, 2 and 3 ranks"
    else bad "Hugging Face init across ranks" "files or losses differ"; fi
    mpirun_t 60 1 train --init hfl/model.safetensors --data t53.bin $COMMON --save-final hfile.bin > hfile.out 2>&1 \
        && cmp -s h1.bin hfile.bin && ok "--init FILE.safetensors (config.json beside it) is the same model" \
        || bad "--init FILE.safetensors" "$(tail -n 2 hfile.out | tr '\n' ' ')"

    # refusals, each named: a malformed copy of hfl per case
    mutate() { # mutate CASE: hfl -> bad/ with one thing wrong
        rm -rf bad && cp -r hfl bad && "$PY" - "$1" <<'PYEOF'
import json, sys
import numpy as np
case, path = sys.argv[1], "bad/model.safetensors"
raw = bytearray(open(path, "rb").read())
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
def put(h, data):
    j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(len(j).to_bytes(8, "little") + j + bytes(data))
q = "model.layers.1.self_attn.q_proj.weight"; k = "model.layers.1.self_attn.k_proj.weight"
if case == "hdrlen":
    raw[:8] = (len(raw) + 100).to_bytes(8, "little"); open(path, "wb").write(raw)
elif case == "overlap":
    h[k]["data_offsets"] = [h[q]["data_offsets"][0] + 2, h[q]["data_offsets"][0] + 2 + (h[k]["data_offsets"][1] - h[k]["data_offsets"][0])]; put(h, data)
elif case == "oob":
    e = h[q]["data_offsets"]; h[q]["data_offsets"] = [len(data) - 2, len(data) - 2 + e[1] - e[0]]; put(h, data)
elif case == "dtype":
    h[q]["dtype"] = "F64"; put(h, data)
elif case == "missing":
    del h[k]; put(h, data)
elif case == "unexpected":
    h["model.layers.0.self_attn.q_norm.weight"] = {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}; put(h, data)
elif case == "nan":
    b = h["model.norm.weight"]["data_offsets"][0] + 6; data[b:b + 2] = b"\xc0\x7f"; put(h, data)
elif case == "shape":
    c = json.load(open("bad/config.json")); c["intermediate_size"] += 8; json.dump(c, open("bad/config.json", "w"))
elif case == "json":
    raw[8:12] = b"[1, "; open(path, "wb").write(raw)
elif case == "layer":
    h["model.layers.7.mlp.up_proj.weight"] = h.pop("model.layers.1.mlp.up_proj.weight"); put(h, data)
PYEOF
    }
    hf_refused() { # hf_refused CASE PATTERN
        mutate "$1"
        mpirun_t 60 1 train --init bad --data t53.bin $COMMON > bad.out 2>&1
        local rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$2" bad.out; then ok "refused ($1): $(grep -o "$2.*" bad.out | head -n 1 | cut -c1-110)"
        else bad "refused: $1" "rc=$rc $(grep -m1 error bad.out)"; fi
    }
    hf_refused hdrlen "runs past the end of the file"
    hf_refused overlap "overlap"
    hf_refused oob "out of bounds"
    hf_refused dtype "dtype F64 is not supported"
    hf_refused missing "missing tensor model.layers.1.self_attn.k_proj.weight"
    hf_refused unexpected "unexpected tensor model.layers.0.self_attn.q_norm.weight"
    hf_refused nan "tensor model.norm.weight holds a non-finite value"
    hf_refused shape "disagrees with the config"
    hf_refused json "the header is not a JSON object"
    hf_refused layer "unexpected tensor model.layers.7.mlp.up_proj.weight"
fi

# 4. Hugging Face models out: round trips byte-identical in the tensors, shards with an index,
# --save-final FILE.safetensors the same on 1 and 3 ranks and the same as convert --to hf
if [ $TORCH = 1 ]; then
    same_tensors() { # same_tensors A B [strip-prefix]: every tensor of A (a file or dir) in B, same bytes
        "$PY" - "$@" <<'PYEOF'
import glob, os, sys
sys.path.insert(0, os.environ["SRC"] + "/tests/reference")
import st_write
def load(p):
    fs = [p] if p.endswith(".safetensors") else sorted(glob.glob(p + "/*.safetensors"))
    out = {}
    for f in fs:
        out.update(st_write.read_safetensors(f)[0])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if len(sys.argv) > 3 and sys.argv[3] == "subset":   # only A's tensors
    b = {k: v for k, v in b.items() if k in a}
elif len(sys.argv) > 3:   # GPT-2 as HF writes it: drop the prefix, the masks and the tied lm_head
    a = {k[len("transformer."):]: v for k, v in a.items() if k.startswith("transformer.") and not k.endswith(".attn.bias")}
sys.exit(0 if a.keys() == b.keys() and all(a[k] == b[k] for k in a) else 1)
PYEOF
    }
    export SRC
    "$PIPELM" convert --to hf --dtype bf16 hfl out1 > cv.out 2>&1 && same_tensors hfl out1 \
        && grep -q '"tie_word_embeddings": true' out1/config.json && grep -q '"factor": 32' out1/config.json \
        && ok "safetensors (BF16, tied) -> pipelm -> safetensors: byte-identical tensors, config.json tied, factor 32" \
        || bad "BF16 round trip" "$(tail -n 2 cv.out | tr '\n' ' ')"
    "$PY" "$SRC/tests/reference/torch_llama.py" --write-hf hf32
    if "$PIPELM" convert --to hf --shard-size 30000 hf32 out2 > cv.out 2>&1 && [ -f out2/model.safetensors.index.json ] \
            && [ -f out2/model-00002-of-$(ls out2/*-of-* | head -n 1 | sed 's/.*-of-\([0-9]*\).*/\1/').safetensors ] \
            && same_tensors hf32 out2 && "$PIPELM" convert --to hf out2 out3 > cv2.out 2>&1 && same_tensors hf32 out3; then
        ok "F32 -> shards of 30000 bytes with an index -> read back -> one file: byte-identical tensors ($(ls out2/*-of-* | wc -l) shards)"
    else bad "sharded round trip" "$(tail -n 2 cv.out cv2.out | tr '\n' ' ')"; fi
    "$PY" -c "
import json; p = 'out2/model.safetensors.index.json'; j = json.load(open(p))
j['weight_map']['model.norm.weight'] = 'model-00001-of-' + sorted(set(j['weight_map'].values()))[0][-17:]
json.dump(j, open(p, 'w'))"
    "$PIPELM" convert --to hf out2 out4 > ix.out 2>&1
    [ $? -ne 0 ] && grep -q "weight_map puts tensor model.norm.weight in model-00001-of" ix.out \
        && ok "refused: an index naming the wrong shard ($(grep -o 'weight_map puts.*' ix.out | cut -c1-90))" \
        || bad "index naming the wrong shard" "$(tail -n 1 ix.out)"
    "$PY" "$SRC/tests/reference/torch_ref.py" --write-hf hfg
    "$PIPELM" convert --to hf hfg outg > cv.out 2>&1 && same_tensors hfg outg strip \
        && grep -q '"GPT2LMHeadModel"' outg/config.json \
        && ok "GPT-2 safetensors (Conv1D, transformer. prefix) -> pipelm -> safetensors: byte-identical tensors" \
        || bad "GPT-2 round trip" "$(tail -n 2 cv.out | tr '\n' ' ')"
    "$PY" -c "
import numpy as np
h = np.zeros(256, dtype='<i4'); h[:3] = [20240520, 1, 3000]
with open('t97.bin', 'wb') as f: h.tofile(f); (np.arange(3000) * 7 % 97).astype('<u2').tofile(f)"
    for P in 1 3; do
        mpirun_t 120 $P train --init hfg --data t97.bin $COMMON --seq-len 8 --save-final g$P.bin --metrics g$P.jsonl \
            > g$P.out 2>&1 || bad "GPT-2 --init hfg on $P ranks" "$(tail -n 2 g$P.out | tr '\n' ' ')"
    done
    cmp -s g1.bin g3.bin && [ -n "$(losses g1.jsonl)" ] && [ "$(losses g1.jsonl)" = "$(losses g3.jsonl)" ] \
        && ok "a GPT-2 from Hugging Face files trains the same bits on 1 and 3 ranks (the tied wte summed)" \
        || bad "GPT-2 Hugging Face init across ranks" "files or losses differ"
    for P in $RANKS; do
        mpirun_t 120 $P train --init hfl --data t53.bin $COMMON --save-final sf$P.safetensors --save-dtype bf16 \
            > sf$P.out 2>&1 || bad "--save-final .safetensors on $P ranks" "$(tail -n 2 sf$P.out | tr '\n' ' ')"
    done
    # h1.bin is the same training as an llm.c file (which holds the tied head in its lm_head slot)
    "$PIPELM" convert --to hf --dtype bf16 h1.bin sfc.safetensors > cv.out 2>&1
    if cmp -s sf1.safetensors sf3.safetensors && same_tensors sf1.safetensors sfc.safetensors subset; then
        ok "--save-final FILE.safetensors (BF16): the same bytes on 1 and 3 ranks, the tensors convert --to hf writes"
    else bad "--save-final safetensors" "files differ: $(tail -n 1 cv.out)"; fi
fi

# (the llama-1b preset against Llama 3.2 1B: test_model, test_llama_1b_preset)
finish
