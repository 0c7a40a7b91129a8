#!/bin/bash
# test_tokenize.sh — issue 39: the byte-level BPE tokenizer and `pipelm tokenize`.
# Plain tier: two tokenizer.json fixtures the test trains itself (tests/reference/bpe_ref.py,
# 300 merges: GPT-2's ByteLevel regex; Llama 3's Split regex with ignore_merges) encode a
# varied corpus (prose, code, CJK, emoji, whitespace runs, digits, special-token strings) to
# the ids of bpe_ref.py's independent encoder; decode(encode(x)) == x, bytes that are not UTF-8
# included; the shards are byte-identical on 1, 2 and 3 ranks (text, JSON lines, gzip, --lines,
# several shards); bad JSON lines are refused or skipped and counted, named by file and line on
# every rank; bad tokenizers and options are refused by name.
# Full tier: OpenAI's tiktoken (npm, installed into the build directory) on 12 MB of that
# corpus with GPT-2's and Llama 3's vocabularies, each as a tiktoken rank file and as a
# tokenizer.json (tests/reference/bpe_tiktoken.js makes them from what the npm packages ship).
. "$(dirname "$0")/../lib/lib.sh"
top=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=$(pwd)
PY=/usr/bin/python3
REF=$top/tests/reference/bpe_ref.py
"$PY" -c 'import regex' 2> /dev/null || { echo "FAIL: $PY cannot import regex (python3-regex: ./jobs/setup.sh --test)"; exit 1; }
cd "$WORK"
mkdir -p c big out
# the plain tier keeps the Python reference's work small (0.1 MB of corpus, fixtures of 100
# merges trained on 20 kB) and runs tokenize on 1 and 2 ranks; the full tier: 0.4 MB, 300
# merges on 100 kB, 3 ranks too
if full_tier; then CMB=0.4 TRAIN_B=100000 MERGES=300 RANKS="1 2 3"; else CMB=0.1 TRAIN_B=20000 MERGES=100 RANKS="1 2"; fi
RMAX=${RANKS##* }
"$PY" "$REF" corpus c $CMB 1 || bad "corpus" "bpe_ref.py corpus failed"
"$PY" "$REF" hard hard.txt 60 2
{ cat c/doc_000*.txt | "$PY" -c "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read($TRAIN_B).decode('utf-8', 'ignore').encode())"
  cat hard.txt; } > train.txt
for k in gpt2 llama3; do "$PY" "$REF" fixture $k.json train.txt $MERGES $k || bad "fixture $k" "failed"; done

# tok NAME RANKS ARGS...: pipelm tokenize into out/NAME (NAME.log)
tok() {
    local n=$1 r=$2
    shift 2
    mpirun_t 120 "$r" tokenize --out "out/$n" "$@" > "$n.log" 2>&1 || bad "$n" "exit $? $(tail -3 "$n.log")"
}

# 1. the fixtures against the independent encoder, and back to the text
for k in gpt2 llama3; do
    tok $k 1 --tokenizer $k.json c/doc_*.txt
    "$PY" "$REF" encode $k.json ref_$k.bin c/doc_*.txt
    cmp -s ref_$k.bin out/${k}_val_000000.bin && ok "$k fixture: the ids of the independent encoder ($(ls c | wc -l) documents, $(du -k c | cut -f1) kB)" \
        || bad "$k ids" "differ from bpe_ref.py's ($(cmp ref_$k.bin out/${k}_val_000000.bin 2>&1 | head -1))"
    grep -q 'tokens/s' $k.log && grep -q 'MB/s' $k.log && ok "$k: the closing line has MB/s and tokens/s" || bad "$k report" "$(tail -1 $k.log)"
    mpirun_t 60 1 tokenize --tokenizer $k.json --decode out/${k}_val_000000.bin > dec_$k.txt 2> dec_$k.err
    for f in c/doc_*.txt; do printf '<|endoftext|>'; cat "$f"; done > want_$k.txt
    cmp -s dec_$k.txt want_$k.txt && ok "$k: decode(encode(x)) == x" || bad "$k decode" "$(cmp dec_$k.txt want_$k.txt 2>&1)"
done
head -c 200000 /dev/urandom > rnd.bin
printf 'caf\xc3\xa9 \xff\xfe half \xe4\xb8 end \xed\xa0\x80 surrogate \xc0\xaf overlong' > bad8.txt
tok rnd 1 --tokenizer gpt2.json --format text rnd.bin bad8.txt
mpirun_t 60 1 tokenize --tokenizer gpt2.json --decode out/rnd_val_000000.bin > rnd_dec.bin 2> /dev/null
{ printf '<|endoftext|>'; cat rnd.bin; printf '<|endoftext|>'; cat bad8.txt; } | cmp -s - rnd_dec.bin \
    && ok "bytes that are not UTF-8 (random bytes, truncated, surrogate, overlong) encode as bytes and decode back" \
    || bad "invalid UTF-8" "the decoded bytes differ"
printf 'x <|endoftext|> y' > sp.txt
tok sp0 1 --tokenizer gpt2.json sp.txt
tok sp1 1 --tokenizer gpt2.json --special 1 sp.txt
eot=$(od -An -tu2 -j1024 -N2 out/sp0_val_000000.bin | tr -d ' ')
n0=$(od -An -tu2 -j1026 -v out/sp0_val_000000.bin | tr -s ' ' '\n' | grep -c "^$eot$")
n1=$(od -An -tu2 -j1026 -v out/sp1_val_000000.bin | tr -s ' ' '\n' | grep -c "^$eot$")
[ "$n0" = 0 ] && [ "$n1" = 1 ] && ok "special-token text: ordinary text by default, the token with --special 1" \
    || bad "special" "end-of-text ids in the text: $n0 (want 0) and $n1 (want 1)"

# 2. the same shards on 1, 2 and 3 ranks
"$PY" - c > docs.jsonl << 'EOF'
import glob, json, sys
for i, f in enumerate(sorted(glob.glob(sys.argv[1] + "/doc_*.txt"))):
    t = open(f, encoding="utf-8").read()
    print(json.dumps({"id": i, "text": t[:3000]}))
    print(json.dumps({"text": t[3000:9000], "n": [1, 2]}, ensure_ascii=False))
EOF
head -40 docs.jsonl | gzip > more.jsonl.gz
cp c/doc_0001.txt one.txt
for r in $RANKS; do
    # 1 rank holds its tokens in memory; 2 and 3 spill them to a file every 997 (the test hook)
    [ $r -gt 1 ] && export PIPELM_TOKENIZE_SPILL=997
    tok mix$r $r --tokenizer llama3.json --shard-tokens 7000 c/doc_0000.txt docs.jsonl more.jsonl.gz one.txt
    tok lines$r $r --tokenizer gpt2.json --shard-tokens 5000 --lines train.txt c/doc_0002.txt
    unset PIPELM_TOKENIZE_SPILL
done
ls out/*.tokens.tmp > /dev/null 2>&1 && bad "spill files" "left behind: $(ls out/*.tokens.tmp)" || ok "no spill file left behind"
nsh=$(ls out/mix1_* | wc -l)
same=1
for f in out/mix1_* out/lines1_*; do
    for r in ${RANKS#1 }; do cmp -s "$f" "${f/1_/${r}_}" || same=0; done
done
[ "$nsh" -gt 3 ] && [ $same = 1 ] && ok "text, JSON lines, gzip ($nsh shards) and --lines: the same bytes on ${RANKS// /, } ranks (spilled or not)" \
    || bad "ranks" "$nsh shards, same=$same"
ls out/mix1_val_000000.bin out/mix1_train_000001.bin > /dev/null 2>&1 && ok "shards named NAME_val_000000.bin, NAME_train_000001.bin, ..." \
    || bad "names" "$(ls out | head -3)"
want=$(( $(wc -l < docs.jsonl) + $(zcat more.jsonl.gz | wc -l) + 2 ))
grep -q "| $want documents" mix$RMAX.log && ok "every document once over $RMAX ranks ($want)" || bad "documents" "$(tail -1 mix$RMAX.log)"

# 3. bad JSON lines: refused on every rank, or skipped and counted, named by file and line
{ head -5 docs.jsonl; echo '{"text": "ok"'; head -3 docs.jsonl; echo '{"body": "no text key"}'; echo '{"text": 5}'; } > bad.jsonl
mpirun_t 60 2 tokenize --tokenizer gpt2.json --out out/bad bad.jsonl > bad.log 2>&1
rc=$?
[ $rc = 2 ] && grep -q "bad.jsonl line 6: not JSON" bad.log && grep -q "rank 0" bad.log && grep -q "rank 1" bad.log \
    && ! ls out/bad_* > /dev/null 2>&1 && ok "a bad JSON line refuses the input, named by file and line, a message on every rank, no shard" \
    || bad "refuse" "exit $rc: $(head -c 400 bad.log)"
mpirun_t 60 2 tokenize --tokenizer gpt2.json --out out/skip --on-error skip bad.jsonl > skip.log 2>&1 || bad "skip" "exit $?"
grep -q "bad lines: 3 (skipped)" skip.log && grep -q "line 6: not JSON" skip.log && grep -q "line 10: no text key" skip.log \
    && grep -q "line 11: the text key is not a string" skip.log && grep -q "| 8 documents" skip.log \
    && ok "--on-error skip: 3 bad lines named and counted, the 8 others kept" || bad "skip" "$(cat skip.log | head -c 600)"

# 4. refusals by name
printf '{"model": {"type": "WordPiece"}}' > wp.json
"$PY" -c "import json; t = json.load(open('gpt2.json')); t['normalizer'] = {'type': 'NFKC'}; json.dump(t, open('nfkc.json', 'w'))"
printf 'IQ== 0\nIg== 5\n' > gap.tiktoken
expect "a WordPiece tokenizer.json" 2 "rank 0: error: tokenizer wp.json: .*normalizer\|model type WordPiece" \
    "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer wp.json --out out/x one.txt
expect "a normalizer" 2 "normalizer NFKC is not supported" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer nfkc.json --out out/x one.txt
expect "a rank file out of order" 2 "gap.tiktoken: line 2 is not \"base64 rank\" with rank 1" \
    "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gap.tiktoken --out out/x one.txt
expect "a missing input" 1 "rank 1: error: input nope.txt" "$MPIEXEC" -n 2 "$PIPELM" tokenize --tokenizer gpt2.json --out out/x nope.txt
expect "a directory as input" 1 "input c: .*directory" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gpt2.json --out out/x c
expect "an unknown option" 2 "unknown option --shards" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gpt2.json --out out/x --shards 3 one.txt
expect "no inputs" 2 "give --tokenizer FILE, --out DIR/NAME and inputs" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gpt2.json --out out/x
expect "an unwritable output, before any work" 1 "shard /nonexistent/x_val_000000.bin" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gpt2.json --out /nonexistent/x one.txt
printf 'not gzip' | gzip | head -c 20 > trunc.jsonl.gz
expect "a truncated gzip" 1 "trunc.jsonl.gz: reading it failed" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer gpt2.json --out out/x trunc.jsonl.gz
"$PY" -c "import struct; open('llmc_tok.bin', 'wb').write(struct.pack('<256i', 20240328, 1, 2, *[0] * 253) + b'\x01a\x01b')"
expect "llm.c's tokenizer file cannot encode" 2 "llm.c's tokenizer file only decodes" "$MPIEXEC" -n 1 "$PIPELM" tokenize --tokenizer llmc_tok.bin --out out/x one.txt
expect "tokenize --help" 0 "--shard-tokens N" "$MPIEXEC" -n 1 "$PIPELM" tokenize --help

# 5. generate --prompt TEXT: the prompt's ids are tokenize's, the continuation the ids prompt's
printf 'Hello world, the quick brown fox' > p1.txt
printf 'int main(void) {\n\treturn 0; // caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87' > p2.txt
tok pr 1 --tokenizer gpt2.json p1.txt p2.txt
od -An -tu2 -j1026 -v out/pr_val_000000.bin | tr -s ' \n' ' ' | sed "s/^ //; s/ $eot /\n/; s/ *$//; s/ /,/g" > ids.txt
echo >> ids.txt
printf '%s\n%s\n' "$(cat p1.txt)" "$(tr '\n' ' ' < p2.txt)" > texts.txt
tr '\n' ' ' < p2.txt > p2l.txt
GEN="generate --vocab-size 600 --max-new-tokens 10 --seed 3"
mpirun_t 60 1 $GEN --prompt-file ids.txt --tokens-out g_ids.tok > g_ids.log 2>&1 || bad "generate ids" "exit $?"
mpirun_t 60 1 $GEN --tokenizer gpt2.json --prompt "$(cat p1.txt)" --prompt="$(cat p2l.txt)" --tokens-out g_txt.tok > g_txt.log 2>&1 \
    || bad "generate --prompt" "exit $? $(tail -2 g_txt.log)"
mpirun_t 60 2 $GEN --tokenizer gpt2.json --prompt-file texts.txt --prompt-format text --tokens-out g_file.tok > g_file.log 2>&1 \
    || bad "generate --prompt-file text" "exit $? $(tail -2 g_file.log)"
[ "$(wc -l < ids.txt)" = 2 ] && [ -s g_ids.tok ] && cmp -s g_ids.tok g_txt.tok && cmp -s g_ids.tok g_file.tok \
    && grep -q "^\[0\] Hello world, the quick brown fox" g_txt.log \
    && ok "generate --prompt TEXT (and --prompt-format text on 2 ranks): the tokens of the ids prompt, the text printed" \
    || bad "generate --prompt" "$(paste -d' ' g_ids.tok g_txt.tok g_file.tok | head -2)"
expect "--prompt without a BPE tokenizer" 2 "--prompt TEXT needs --tokenizer" "$MPIEXEC" -n 1 "$PIPELM" $GEN --prompt hi

# 6. the shards through --data: one shard read "inorder:" is the file read alone (eval's loss
# bit for bit); a shuffled glob of them gives the same token stream on D = 1 and D = 2
E="eval --preset tiny --vocab-size 600 --batch 4 --seq-len 32 --batches 3 --threads 1"
mpirun_t 60 1 $E --data out/mix1_train_000002.bin > ev_file.log 2>&1 || bad "eval file" "exit $? $(tail -2 ev_file.log)"
mpirun_t 60 1 $E --data 'inorder:out/mix1_train_000002.bin' > ev_sh.log 2>&1 || bad "eval shard" "exit $? $(tail -2 ev_sh.log)"
l1=$(grep -o "loss [0-9.]*" ev_file.log); l2=$(grep -o "loss [0-9.]*" ev_sh.log)
[ -n "$l1" ] && [ "$l1" = "$l2" ] && grep -q "1 shard (.*in order)" ev_sh.log \
    && ok "a shard read through --data 'inorder:...' gives the file's own tokens in order (eval $l1)" || bad "inorder" "'$l1' vs '$l2'"
TR="train --preset tiny --vocab-size 600 --steps 3 --batch 8 --seq-len 32 --eval-every 0 --progress 0 --log-every 1 --threads 1"
mpirun_t 90 1 $TR --grad-accum exact --data 'out/mix1_train_*.bin' --metrics sh1.jsonl > sh1.log 2>&1 || bad "train shards" "exit $? $(tail -2 sh1.log)"
mpirun_t 90 2 $TR --grad-accum exact --dp 2 --data 'out/mix1_train_*.bin' --metrics sh2.jsonl > sh2.log 2>&1 \
    || bad "train shards dp" "exit $? $(tail -2 sh2.log)"
grep -q "shuffled per epoch" sh1.log && [ "$(losses sh1.jsonl | head -1)" = "$(losses sh2.jsonl | head -1)" ] && close sh1.jsonl sh2.jsonl 1e-6 \
    && ok "shuffled shards: D = 1 and D = 2 train on the same token stream (step 1 bit for bit)" \
    || bad "shards dp" "$(losses sh1.jsonl | tr '\n' ' ') vs $(losses sh2.jsonl | tr '\n' ' ')"
"$PY" -c "import struct; open('u32.bin', 'wb').write(struct.pack('<256i', 20240801, 7, 300, *[0] * 253) + struct.pack('<300I', *range(300)))"
expect "uint16 and uint32 shards mixed, refused by name" 2 "shard u32.bin holds uint32 tokens but out/mix1_val_000000.bin uint16" \
    "$MPIEXEC" -n 1 "$PIPELM" $E --data "out/mix1_val_000000.bin,u32.bin"

# 7. full tier: tiktoken itself, GPT-2 and Llama 3, 12 MB
if full_tier; then
    NPM_DIR=${PIPELM_NPM_DIR:-$BUILD/npm-tokenizers}
    if [ ! -d "$NPM_DIR/node_modules/tiktoken" ] || [ ! -d "$NPM_DIR/node_modules/llama3-tokenizer-js" ]; then
        npm install --prefix "$NPM_DIR" --no-audit --no-fund --no-save tiktoken@1.0.22 llama3-tokenizer-js@1.2.0 > npm.log 2>&1 \
            || { echo "FAIL: npm install of tiktoken and llama3-tokenizer-js failed: $(tail -3 npm.log)"; exit 1; }
    fi
    M=$NPM_DIR/node_modules
    node "$top/tests/reference/bpe_tiktoken.js" files "$M" . || bad "vocabularies" "bpe_tiktoken.js files failed"
    "$PY" "$REF" corpus big 12 7
    for v in gpt2 llama3; do
        node "$top/tests/reference/bpe_tiktoken.js" encode "$M" $v tt_$v.bin big/doc_*.txt || bad "tiktoken $v" "failed"
        for k in tiktoken json; do
            tok big_${v}_$k 1 --tokenizer $v.$k big/doc_*.txt
            cmp -s tt_$v.bin out/big_${v}_${k}_val_000000.bin && ok "$v.$k: the ids of OpenAI's tiktoken on 12 MB" \
                || bad "$v.$k" "differs from tiktoken: $(cmp tt_$v.bin out/big_${v}_${k}_val_000000.bin 2>&1)"
        done
    done
else
    full_only "GPT-2 and Llama 3 vocabularies against OpenAI's tiktoken (npm) on 12 MB"
fi
finish
