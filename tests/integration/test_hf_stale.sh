#!/bin/bash
# test_hf_stale.sh — a Hugging Face directory is never a mix of two saves (issue 37, item 5):
# writing a one-file model into a directory that holds an index and shards (or the reverse)
# is refused by name and leaves the directory as it was; the same layout again replaces its
# own files; the reader refuses a directory holding a single file beside an index, a shard the
# index does not name, or shards without an index, naming the file — never the old weights.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0 --log-every 100"
mpirun_t 120 1 train $C --steps 2 --save-final a.bin > a.out 2>&1 || bad "train a" "exit $?"
mpirun_t 120 1 train $C --steps 2 --seed 7 --save-final b.bin > b.out 2>&1 || bad "train b" "exit $?"
"$PIPELM" convert --to hf --shard-size 100000 a.bin sh > o.out 2>&1 || bad "sharded save" "$(tail -1 o.out)"
"$PIPELM" convert --to hf a.bin one > o.out 2>&1 || bad "one-file save" "$(tail -1 o.out)"
snap() { (cd "$1" && md5sum *); }
s_sh=$(snap sh); s_one=$(snap one)
expect "one file into a sharded directory: refused, naming the stale file" 1 \
    "sh already holds model-.*-of-.*safetensors, which this one-file model would leave beside its own" \
    "$PIPELM" convert --to hf b.bin sh
[ "$(snap sh)" = "$s_sh" ] && ok "the sharded directory is unchanged" || bad "sh changed" "$(ls sh)"
expect "shards into a one-file directory: refused" 1 "one already holds model.safetensors, which this sharded model" \
    "$PIPELM" convert --to hf --shard-size 100000 b.bin one
[ "$(snap one)" = "$s_one" ] && ok "the one-file directory is unchanged" || bad "one changed" "$(ls one)"
# the same layout again replaces its own files
"$PIPELM" convert --to hf b.bin fresh > /dev/null 2>&1
if "$PIPELM" convert --to hf b.bin one > o.out 2>&1 && cmp -s one/model.safetensors fresh/model.safetensors &&
    cmp -s one/config.json fresh/config.json; then
    ok "a one-file save over a one-file directory replaces it (b's files, as a fresh save writes them)"
else bad "same layout" "$(tail -1 o.out)"; fi
# the reader: a single file beside an index, a stray shard, shards without their index
cp -r sh mixed && cp one/model.safetensors mixed/
expect "reader: model.safetensors beside an index refused" 1 "mixed holds model.safetensors, which its model.safetensors.index.json does not name" \
    "$PIPELM" convert mixed x.h5
cp -r sh stray && cp sh/model-00001-of-*.safetensors stray/model-00099-of-00099.safetensors
expect "reader: a shard the index does not name refused" 1 "stray holds model-00099-of-00099.safetensors, which its .* does not name" \
    "$PIPELM" convert stray x.h5
cp -r one orphan && cp sh/model-00001-of-*.safetensors orphan/ 
expect "reader: shards without an index refused" 1 "orphan holds model-00001-of-.* but no model.safetensors.index.json" \
    "$PIPELM" convert orphan x.h5
[ ! -e x.h5 ] && ok "no output written from a mixed directory" || bad "x.h5" "written"
# config.json is written beside and renamed: a FIFO in its place is refused, never opened
mkdir fdir && mkfifo fdir/config.json
timeout 30 "$PIPELM" convert --to hf a.bin fdir > o.out 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -p fdir/config.json ] && grep -q "config.json: is a FIFO" o.out; then
    ok "a FIFO named config.json: refused by name, no hang, still a FIFO"
else bad "config.json FIFO" "rc=$rc $(grep -m1 error o.out)"; fi
finish
