#!/bin/bash
# test_badinput.sh — bad input found by trying it (issue 8, section 3): special files (FIFOs,
# devices, directories) given as inputs, a token file truncated while training, checkpoint
# attributes edited out of range (h5py), a garbage or escaping DIR/latest, resuming with other
# data settings, weights holding NaN, absurd dimensions, and values the parsers used to read
# wrongly. Each must end every rank quickly, non-zero, with a message naming the file or the
# option. Every run is under a timeout; a hang fails.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
# Debian's python3 (with python3-h5py) rather than whatever python3 comes first on PATH
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
C="--preset tiny --batch 4 --seq-len 16 --eval-every 0 --progress 0 --log-every 100"

# refused NAME SECONDS NP PATTERN ARGS...: non-zero exit (not a timeout), PATTERN in the output,
# no signal death (Bus error, Segmentation fault) anywhere
refused() {
    local name=$1 secs=$2 np=$3 pat=$4
    shift 4
    local out rc
    out=$(mpirun_t "$secs" "$np" "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && printf '%s\n' "$out" | grep -q -- "$pat" \
            && ! printf '%s\n' "$out" | grep -qi "bus error\|segmentation fault\|signal 7\|signal 11"; then
        ok "$name: $(printf '%s\n' "$out" | grep -m1 -- "$pat" | cut -c1-160)"
    else
        bad "$name" "exit $rc, output: $(printf '%s' "$out" | tail -n 4 | tr '\n' ' ' | cut -c1-400)"
    fi
}

# tokens FILE N: an llm.c token file of N uint16 tokens < 256
tokens() {
    $PY -c "
import struct, sys
n = int(sys.argv[2])
h = [20240520, 1, n] + [0] * 253
open(sys.argv[1], 'wb').write(struct.pack('<256i', *h) + struct.pack('<%dH' % n, *[(i * 7 + i // 13) % 256 for i in range(n)]))
" "$1" "$2"
}

# ---- special files never block or spin: refused at once, naming the file and its type ----
mkfifo fifo
tokens tok.bin 20000
refused "--data FIFO" 30 2 "data file fifo: is a FIFO" train $C --steps 1 --data fifo
refused "text:FIFO" 30 1 "data file fifo: is a FIFO" train $C --steps 1 --data text:fifo
refused "--val-data FIFO" 30 2 "data file fifo: is a FIFO" train $C --steps 1 --data tok.bin --val-data fifo
refused "--init FIFO" 30 2 "model file fifo: is a FIFO" train $C --steps 1 --init fifo
refused "--config FIFO" 30 2 "config file fifo: is a FIFO" train --config fifo
refused "--config /dev/zero" 30 1 "config file /dev/zero: is a character device" train --config /dev/zero
refused "--config DIR" 30 1 "config file .: is a directory" train --config .
refused "--resume FIFO" 30 2 "checkpoint fifo: is a FIFO" train $C --steps 1 --resume fifo
refused "--metrics FIFO" 30 1 "metrics file fifo: is a FIFO" train $C --steps 1 --metrics fifo
refused "--data /dev/zero" 30 1 "/dev/zero: is a character device" train $C --steps 1 --data text:/dev/zero
refused "inspect FIFO" 30 1 "fifo: is a FIFO" inspect fifo
refused "convert FIFO" 30 1 "fifo: is a FIFO" convert fifo out.h5

# ---- a token file truncated while training: every rank ends with the file named, no SIGBUS ----
tokens big.bin 400000
mpirun_t 120 2 train $C --steps 100000 --data big.bin > trunc.out 2>&1 &
pid=$!
for i in $(seq 1 100); do grep -q "^step" trunc.out 2>/dev/null && break; sleep 0.2; done
sleep 0.5
truncate -s 2048 big.bin
t0=$(date +%s)
wait $pid
rc=$?
dt=$(($(date +%s) - t0))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $dt -le 20 ] && grep -q "data file big.bin: shrank while training" trunc.out \
        && ! grep -qi "bus error\|signal 7" trunc.out; then
    ok "data file truncated while training: all ranks ended in ${dt} s: $(grep -m1 shrank trunc.out | cut -c1-120)"
else
    bad "data file truncated while training" "exit $rc after ${dt} s: $(tail -n 4 trunc.out | tr '\n' ' ' | cut -c1-400)"
fi

# ---- huge dimensions and strict parsing: refused by name, at once ----
refused "--n-layer 1000000000" 30 2 "n-layer=1000000000 is too large" train $C --steps 1 --n-layer 1000000000
refused "--n-layer 1000000 --n-embd 8" 30 2 "n-layer=1000000 is too large" train $C --steps 1 --n-layer 1000000 --n-embd 8 --n-head 1
refused "--vocab-size 2147483647" 30 1 "vocab-size=2147483647 is too large" train $C --steps 1 --vocab-size 2147483647
refused "--n-embd 65536" 30 1 "model too large: tensor fc_w" train $C --steps 1 --n-embd 65536 --n-head 1
refused "--split 99999999999,0" 30 2 "block count 99999999999 is larger than" train $C --steps 1 --split 99999999999,0
refused "--split 1,3," 30 2 "split '1,3,'.*empty entry" train $C --steps 1 --split 1,3,
refused "--lr 0x10" 30 1 "bad value '0x10' for --lr" train $C --steps 1 --lr 0x10
refused "--lr inf" 30 1 "bad value 'inf' for --lr" train $C --steps 1 --lr inf
printf 'steps = 2\nbatch = 4\nsteps = 3\n' > dup.ini
refused "duplicate config key" 30 1 "dup.ini, line 3: 'steps' is set twice (first on line 1)" train --config dup.ini
printf 'steps = 2\n[train]\nbatch = 4\n' > sec.ini
refused "config [section]" 30 1 "sec.ini, line 2: '\[train\]': sections are not supported" train --config sec.ini
printf 'steps = 2\n\nlr = 0x10\n' > hex.ini
refused "config bad value line number" 30 1 "hex.ini, line 3: bad value '0x10' for --lr" train --config hex.ini
printf 'steps = 2\n\001\002\377 = 1\n' > bin.ini
out=$(timeout 30 "$PIPELM" train --config bin.ini 2>&1)
if printf '%s' "$out" | grep -q 'bin.ini, line 2: control character \\x01' && ! printf '%s' "$out" | LC_ALL=C grep -q '[^[:print:][:space:]]'; then
    ok "binary config: escaped, line named: $out"
else bad "binary config" "$(printf '%s' "$out" | od -c | head -n 3)"; fi
printf '  steps = 2\r\nbatch = 4 ; inline\n' > ok.ini
mpirun_t 60 1 train --config ok.ini --seq-len 16 --progress 0 --eval-every 0 > okini.out 2>&1 \
    && grep -q "step     2/2" okini.out && ok "indented, CRLF and commented config lines accepted" \
    || bad "good config" "$(tail -n 2 okini.out)"

# ---- weights holding NaN: refused at load, naming the tensor and the file ----
mpirun_t 60 1 train $C --steps 1 --save-final w.bin > w.out 2>&1 || bad "write w.bin" "$(tail -n 2 w.out)"
$PY - <<'EOF'
import struct
# tiny: V=256 (Vp 256), maxT=64, C=64, L=4; poke a NaN into h.3.qkv_w element 7 (llm.c order:
# wte, wpe, ln1w[L], ln1b[L], qkvw[L], ...)
Vp, T, C, L = 256, 64, 64, 4
off = Vp * C + T * C + 2 * L * C + 3 * (3 * C * C) + 7
b = bytearray(open("w.bin", "rb").read())
b[1024 + 4 * off:1024 + 4 * off + 4] = struct.pack("<f", float("nan"))
open("wnan.bin", "wb").write(b)
EOF
refused "--init with a NaN weight" 60 2 "model file wnan.bin: tensor h.3.qkv_w holds a non-finite" train $C --steps 1 --init wnan.bin

# ---- checkpoints: attributes out of range, edited, missing; latest outside or garbage ----
mpirun_t 120 1 train $C --steps 2 --ckpt-dir ck --ckpt-every 2 > ck.out 2>&1 || bad "save a checkpoint" "$(tail -n 2 ck.out)"
CK=ck/ckpt_00000002.h5
if ! $PY -c "import h5py, numpy" 2>/dev/null; then
    bad "checkpoint attribute edits" "$PY cannot import h5py and numpy (./jobs/setup.sh --test installs them)"
elif [ -f $CK ]; then
    # edit COPY GROUP ATTR PYTHON-VALUE [drop-crc]: a copy of the checkpoint with one attribute set
    edit() {
        cp $CK "$1"
        $PY - "$@" <<'EOF'
import sys, h5py, numpy as np
path, grp, name, val = sys.argv[1:5]
with h5py.File(path, "r+") as f:
    g = f[grp]
    v = eval(val, {"np": np})
    if v is None:
        del g.attrs[name]
    else:
        if name in g.attrs:
            del g.attrs[name]
        g.attrs[name] = v
    if len(sys.argv) > 5:
        del f.attrs["meta_crc32c"]
EOF
    }
    R="train $C --steps 3"
    edit s_m5.h5 / step 'np.int64(-5)';            refused "root step -5" 60 1 "attribute /step = -5 is out of range" $R --resume s_m5.h5
    edit s_max.h5 / step 'np.int64(2**31-1)';      refused "root step 2^31-1" 60 1 "attribute /step = 2147483647 is out of range" $R --resume s_max.h5
    edit s_t12.h5 / step 'np.int64(10**12)';       refused "root step 10^12" 60 1 "attribute /step = 1000000000000 is out of range" $R --resume s_t12.h5
    edit s_5e9.h5 / step 'np.int64(5000000000)';   refused "root step 5e9 (int64)" 60 1 "attribute /step = 5000000000 is out of range" $R --resume s_5e9.h5
    edit s_5e9f.h5 / step '5e9';                   refused "root step 5e9 (float)" 60 1 "attribute /step has the wrong type" $R --resume s_5e9f.h5
    edit ns.h5 /train nstages 'np.int64(999)';     refused "/train nstages=999" 60 1 "attribute /train/nstages = 999 is out of range" $R --resume ns.h5
    edit b1.h5 /optim beta1 'np.float64("nan")';   refused "/optim beta1=nan" 60 1 "attribute /optim/beta1 = nan is out of range" $R --resume b1.h5
    edit dp.h5 /train data_pos 'np.int64(-100)';   refused "/train data_pos=-100" 60 1 "attribute /train/data_pos = -100 is out of range" $R --resume dp.h5
    edit sp2.h5 /train split 'np.array([3], dtype=np.int32)'; refused "/train split != n_layer" 60 1 "attribute /train/split adds up to 3 blocks but /config/n_layer is 4" $R --resume sp2.h5
    edit lr.h5 /train lr 'np.float64(-1e-3)';      refused "/train lr<0" 60 1 "attribute /train/lr = -0.001 is out of range" $R --resume lr.h5
    edit sp.h5 /train split 'np.array([7], dtype=np.int32)'; refused "/train split > n_layer" 60 1 "attribute /train/split: stage 0 holds 7 blocks" $R --resume sp.h5
    edit ds.h5 /train data "b'x' * 600";           refused "/train data too long" 60 1 "attribute /train/data is a string of 600 characters" $R --resume ds.h5
    edit lr2.h5 /optim lr 'np.float64(0.5)';       refused "in-range edit caught by meta_crc32c" 60 1 "metadata checksum mismatch" $R --resume lr2.h5
    edit old.h5 /train markov_branch None drop;    # an older file: no meta_crc32c, no markov_branch
    out=$(mpirun_t 60 1 $R --resume old.h5 2>&1)
    if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "has no meta_crc32c" && printf '%s' "$out" | grep -q "does not record --markov-branch"; then
        ok "older checkpoint (no meta_crc32c, no markov_branch) loads with notes"
    else bad "older checkpoint" "$(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')"; fi
    # a NaN in a dataset whose crc32c was recomputed to match: refused naming the tensor
    cp $CK nan.h5
    $PY - <<'EOF'
import h5py, numpy as np
T = []
for b in range(256):
    c = b
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc(data):
    c = 0xFFFFFFFF
    for x in data:
        c = (c >> 8) ^ T[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF
with h5py.File("nan.h5", "r+") as f:
    d = f["/model/h.2/ln1_b"]
    a = d[...]
    a[3] = np.nan
    d[...] = a
    d.attrs.modify("crc32c", np.uint32(crc(a.astype("<f4").tobytes())))
EOF
    refused "checkpoint tensor NaN (valid CRC)" 60 2 "tensor h.2.ln1_b) holds a non-finite value" $R --resume nan.h5
else
    bad "checkpoint attribute edits" "no checkpoint $CK to edit"
fi
# resuming with other data settings is refused naming the setting and both values
refused "resume with another --markov-branch" 60 1 "saved with --markov-branch 4 but this run has --markov-branch 3" \
    train $C --steps 3 --resume $CK --markov-branch 3
refused "resume with another --data-seed" 60 1 "saved with --data-seed 1 but this run has --data-seed 2" \
    train $C --steps 3 --resume $CK --data-seed 2
# DIR/latest: outside the directory, empty, garbage, a FIFO: refused; missing: fallback, said loudly
latest_case() { # CONTENT PATTERN
    rm -rf L && mkdir L && cp $CK L/ && printf '%s' "$1" > L/latest
    refused "latest = '$(printf '%s' "$1" | head -n 1 | tr -c '[:print:]' '?' | cut -c1-30)'" 60 1 "checkpoint pointer L/latest is $2" train $C --steps 3 --ckpt-dir L --resume
}
latest_case "../ck/ckpt_00000002.h5" "refused (it names a path outside"
latest_case "/etc/passwd" "refused (it names a path outside"
latest_case "" "empty"
latest_case "garbage here" "not a checkpoint name"
latest_case "$(printf 'ckpt_00000002.h5\nsecond line')" "not a checkpoint name"
latest_case "$(printf '\001\002\377')" "not a checkpoint name.*holds '.x01.x02.xff'"
rm -rf L && mkdir L && cp $CK L/ && mkfifo L/latest
refused "latest is a FIFO" 60 1 "L/latest: is a FIFO" train $C --steps 3 --ckpt-dir L --resume
rm -rf L && mkdir L && cp $CK L/
out=$(mpirun_t 60 1 train $C --steps 3 --ckpt-dir L --resume 2>&1)
if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "warning: L/latest is missing: resuming from the newest checkpoint file instead, L/ckpt_00000002.h5"; then
    ok "missing latest: falls back to the newest file, with a warning"
else bad "missing latest" "$(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')"; fi
rm -rf L && mkdir L
refused "no checkpoint at all" 60 1 "no checkpoint in L" train $C --steps 3 --ckpt-dir L --resume

finish
