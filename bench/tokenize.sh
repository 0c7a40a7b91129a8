#!/bin/bash
# bench/tokenize.sh — the BPE encoder's throughput and `pipelm tokenize`'s scaling (issue 39):
#   1. encoding on one core: pipelm tokenize (one rank) against OpenAI's tiktoken (npm package
#      "tiktoken": its Rust core as WebAssembly, one thread, encode_ordinary) on the same
#      MB megabytes of varied text (tests/reference/bpe_ref.py corpus) with GPT-2's ranks and
#      Llama 3's vocabulary (tests/reference/bpe_tiktoken.js makes the files), REPS rounds
#      interleaved; the ids are compared too;
#   2. pipelm tokenize on 1 and 2 ranks (one document a line, the same text three times).
# Both report wall and CPU seconds: on a loaded machine only the CPU seconds compare; `uptime`
# is printed beside each round. Needs node and npm (the packages go into BUILD/npm-tokenizers
# as test_tokenize.sh's full tier installs them).
#   bench/tokenize.sh [BUILD_DIR]   (REPS=3, MB=12, MPIEXEC=mpiexec)
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
PIPELM=$build/pipelm
MPIEXEC=${MPIEXEC:-mpiexec}
REPS=${REPS:-3}
MB=${MB:-12}
NPM_DIR=${PIPELM_NPM_DIR:-$build/npm-tokenizers}
W=$(mktemp -d "${TMPDIR:-/tmp}/tok_bench.XXXXXX")
trap 'rm -rf "$W"' EXIT
if [ ! -d "$NPM_DIR/node_modules/tiktoken" ] || [ ! -d "$NPM_DIR/node_modules/llama3-tokenizer-js" ]; then
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --no-save tiktoken@1.0.22 llama3-tokenizer-js@1.2.0 > "$W/npm.log" 2>&1 \
        || { echo "npm install failed: $(tail -3 "$W/npm.log")"; exit 1; }
fi
M=$NPM_DIR/node_modules
cd "$W"
mkdir c
node "$top/tests/reference/bpe_tiktoken.js" files "$M" .
/usr/bin/python3 "$top/tests/reference/bpe_ref.py" corpus c "$MB" 7
cat c/doc_*.txt > all.txt
cat all.txt all.txt all.txt > all3.txt
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq "$REPS"); do
    for v in gpt2 llama3; do
        echo "round $r $v | $(uptime | sed 's/.*load/load/')"
        node "$top/tests/reference/bpe_tiktoken.js" bench "$M" $v all.txt | sed "s/^/  tiktoken (wasm): /"
        "$PIPELM" tokenize --tokenizer $v.tiktoken --out "$W/p_$v" all.txt | tail -1 \
            | sed 's/.*| \([0-9.]* MB\) in .*(encoding \([0-9.]*\) s, rank 0.s CPU \([0-9.]*\) s).*/  pipelm: \1 encoding \2 s wall \3 s cpu/'
    done
    for n in 1 2; do
        echo "round $r tokenize --lines gpt2 on $n rank(s) | $(uptime | sed 's/.*load/load/')"
        "$MPIEXEC" -n $n "$PIPELM" tokenize --tokenizer gpt2.tiktoken --lines --out "$W/r$n" all3.txt | tail -1 \
            | sed 's/.*| \([0-9.]* MB in [0-9.]* s on [0-9] ranks*\) (encoding \([0-9.]*\) s, rank 0.s CPU \([0-9.]*\) s).*/  \1: encoding \2 s wall, rank 0 \3 s cpu/'
    done
done
node "$top/tests/reference/bpe_tiktoken.js" encode "$M" gpt2 ref.bin all.txt
"$PIPELM" tokenize --tokenizer gpt2.json --out "$W/j" all.txt > /dev/null
cmp -s ref.bin j_val_000000.bin && echo "ids: equal to tiktoken's (gpt2)" || echo "ids: DIFFER from tiktoken's (gpt2)"
