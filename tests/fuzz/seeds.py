#!/usr/bin/env python3
"""seeds.py — (re)write the generated seed inputs of tests/fuzz/corpus/ (small valid and
near-valid inputs for every target). Regression inputs found by fuzzing are committed beside
them as files named crash-*, timeout-*, leak-* or oom-* and are never touched here.
Run: python3 tests/fuzz/seeds.py [PIPELM]  (PIPELM: a built pipelm for the schedule seeds)."""
import os, struct, subprocess, sys

here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, "corpus")

def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

# ---- llm.c model files: 256 int32 header, then the tensors (fp32 v3 or bf16 v5)
def model(V, maxT, L, NH, C, version=3, Vp=None, magic=20240326, extra=0):
    Vp = (V + 127) // 128 * 128 if Vp is None else Vp
    h = [0] * 256
    h[:8] = [magic, version, maxT, V, L, NH, C, Vp]
    n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    esz = 4 if version == 3 else 2
    return struct.pack("<256i", *h) + bytes(range(256)) * ((n * esz) // 256) + bytes((n * esz) % 256 + extra)

put("llmc", "fp32-tiny", model(2, 1, 1, 1, 1))
put("llmc", "bf16-tiny", model(2, 1, 1, 1, 1, version=5))
put("llmc", "fp32-L2-C2", model(130, 2, 2, 2, 2))
put("llmc", "bad-magic", model(2, 1, 1, 1, 1, magic=20240520))
put("llmc", "bad-version", model(2, 1, 1, 1, 1, version=4))
put("llmc", "bad-vp", model(2, 1, 1, 1, 1, Vp=129))
put("llmc", "size-mismatch", model(2, 1, 1, 1, 1, extra=4))
put("llmc", "nh-not-divisor", model(2, 1, 1, 2, 3))
put("llmc", "short-header", model(2, 1, 1, 1, 1)[:600])
put("llmc", "empty", b"")

# ---- token files: byte 0 = kind (even: llm.c tokens, odd: text:), byte 1 = V selector
# (V = 2 + b * 257), then the file
def tokens(toks, ntok=None, magic=20240520, version=1):
    h = [0] * 256
    h[:3] = [magic, version, len(toks) if ntok is None else ntok]
    return struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks)

put("tokens", "valid", b"\x00\x01" + tokens([i % 200 for i in range(300)]))
put("tokens", "one-token", b"\x00\x00" + tokens([1]))
put("tokens", "token-too-big", b"\x00\x00" + tokens([0, 1, 5]))
put("tokens", "ntok-mismatch", b"\x00\x01" + tokens([1, 2, 3], ntok=4))
put("tokens", "ntok-negative", b"\x00\x01" + tokens([1, 2, 3], ntok=-1))
put("tokens", "llama3-magic", b"\x00\x01" + tokens([1, 2], magic=20240801))
put("tokens", "bad-version", b"\x00\x01" + tokens([1, 2], version=2))
put("tokens", "short-header", b"\x00\x01" + tokens([1, 2])[:100])
put("tokens", "text", b"\x01\x01" + b"the quick brown fox jumps over the lazy dog\n" * 8)
put("tokens", "text-small-vocab", b"\x01\x00" + b"abc")
put("tokens", "text-empty", b"\x01\x01")

# ---- INI config files (--config FILE)
put("ini", "valid", "# a run\npreset = tiny\nsteps = 10\nlr = 1e-3\nmicrobatches = 4\nschedule = gpipe\n")
put("ini", "sections", "[model]\nn_layer = 2\nn_embd=32\n[train]\nbatch = 8 ; comment\nmin_lr=0\n")
put("ini", "bench", "warmup = 2\njson = out.json\npeak_gflops = 10.5\n")
put("ini", "unknown-key", "stepz = 10\n")
put("ini", "bad-int", "steps = ten\n")
put("ini", "int-overflow", "steps = 99999999999\n")
put("ini", "bad-double", "lr = nan\n")
put("ini", "duplicate", "steps = 1\nsteps = 2\n")
put("ini", "no-equals", "steps\n")
put("ini", "long-value", "data = " + "x" * 5000 + "\n")
put("ini", "preset-unknown", "preset = huge\n")
put("ini", "crlf-bom", "\ufeffsteps = 3\r\nbatch = 4\r\n")
put("ini", "binary", b"steps = 1\x00\xff\xfe\n\x01\x02=\x03\n")
put("ini", "empty", "")

# ---- command lines: byte 0 (odd: bench options too), then NUL-separated arguments
def cli(*args, bench=0):
    return bytes([bench]) + b"\0".join(a.encode() for a in args)

put("cli", "valid", cli("--preset", "tiny", "--steps", "10", "--microbatches=4", "--lr", "0.001"))
put("cli", "bench", cli("--warmup", "1", "--json=b.json", "--peak-gflops", "3.5", bench=1))
put("cli", "bench-as-train", cli("--warmup", "1"))
put("cli", "resume-bare", cli("--ckpt-dir", "ck", "--resume", "--steps", "5"))
put("cli", "missing-value", cli("--steps"))
put("cli", "unknown", cli("--nope", "1"))
put("cli", "positional", cli("train"))
put("cli", "bad-values", cli("--lr", "0x10", "--steps", "-1", "--batch", "7", "--microbatches", "2"))
put("cli", "huge-dims", cli("--n-layer", "1000000000", "--n-embd", "8", "--vocab-size", "2147483647"))
put("cli", "split", cli("--split", "1,3,", "--schedule", "gpipe"))
put("cli", "long-name", cli("--" + "a" * 100 + "=1"))
put("cli", "long-value", cli("--data", "y" * 5000))
put("cli", "underscore", cli("--max_seq_len=32", "--seq_len", "16", "--n_head", "2"))
put("cli", "empty", b"\x00")

# ---- schedule CSVs (torch's _dump_csv form)
pipelm = sys.argv[1] if len(sys.argv) > 1 else None
if pipelm:
    tmp = os.path.join(corpus, ".tmp.csv")
    for name, P, M in [("gpipe", 2, 2), ("1f1b", 4, 8), ("1f1b", 3, 2), ("gpipe", 1, 3)]:
        subprocess.run([pipelm, "schedule", "--stages", str(P), "--microbatches", str(M), "--schedule", name,
                        "--csv", tmp], check=True, stdout=subprocess.DEVNULL)
        with open(tmp, "rb") as f:
            put("sched", "%s-P%d-M%d" % (name, P, M), f.read())
    os.remove(tmp)
put("sched", "issue8-shared-dinput",
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n1RECV_F0,1F0,1RECV_F1,1F1,1B0,1B1,1SEND_B0,1SEND_B1\n")
put("sched", "deadlock", "0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n")
put("sched", "blanks-crlf", " 0F0 ,,0B0\r\n")
put("sched", "wrong-stage", "1F0,1B0\n")
put("sched", "missing-b", "0F0\n")
put("sched", "bad-action", "0X0\n")
put("sched", "big-mb", "0F999999999,0B999999999\n")
put("sched", "empty-rows", "\n\n0F0,0B0\n")
put("sched", "empty", "")

# ---- schedule costs files (bench --costs-out): valid ones with blocks (N) and replicas (dp),
# and near-valid ones
put("costs", "p2-blocks", "stages 2\nmsg_bytes 32768\nlatency_s 5e-07\nbytes_per_s 8e9\n"
    "stage 0 F 0.0016 B 0.0027 O 0.00066 A 1348096 N 2\nstage 1 F 0.0016 B 0.0025 O 0.0025 A 1414144 N 2\n")
put("costs", "p4-dp2", "stages 4\nmsg_bytes 65536\nlatency_s 2e-5\nbytes_per_s 1e9\ndp 2\n"
    "stage 0 F 0.004 B 0.008 I 0.004 W 0.004 O 0.002 A 1048576 N 1\nstage 1 F 0.004 B 0.008 O 0.002 A 1048576 N 1\n"
    "stage 2 F 0.008 B 0.016 O 0.002 A 1048576 N 1\nstage 3 F 0.004 B 0.008 O 0.002 A 1048576 N 1\n")
put("costs", "p1", "# comment\nstages 1\nstage 0 F 1 B 2\n")
put("costs", "zeros", "stages 3\nstage 0 I 0.1 W 0.1\nstage 1 F 0 B 0 N 0\nstage 2 F 1e-9 N 7\n")
put("costs", "bad-n", "stages 2\nstage 0 F 1 N -1\n")
put("costs", "bad-dp", "stages 2\ndp 0\n")

# ---- checkpoint attribute recipes (see fuzz_ckpt.c): 3 group bytes, then one control byte
# per attribute (0 keeps it); no bytes at all = a valid checkpoint's attributes
NATTR = 37
def recipe(groups=(0, 0, 0), ctl=None, tail=b""):
    c = [0] * NATTR
    for k, v in (ctl or {}).items():
        c[k] = v
    return bytes(groups) + b"".join(v if isinstance(v, bytes) else bytes([v]) for v in c) + tail

put("ckpt", "valid", b"")
put("ckpt", "valid-config-only", recipe(tail=b"\x00\x01"))
put("ckpt", "no-train-group", bytes([0, 0, 1]))
put("ckpt", "config-is-dataset", bytes([2, 0, 0]))
put("ckpt", "step-negative", recipe(ctl={3: b"\x01\x04"}))               # step = -5
put("ckpt", "step-2e31", recipe(ctl={3: b"\x01\x13", 18: b"\x01\x13"}))  # 2^31
put("ckpt", "nstages-1024", recipe(ctl={34: b"\x01\x0d"}))
put("ckpt", "beta1-nan", recipe(ctl={12: b"\x01\x81"}))
put("ckpt", "data-pos-neg", recipe(ctl={20: b"\x01\x19"}))               # -100
put("ckpt", "format-missing", recipe(ctl={0: 3}))
put("ckpt", "format-number", recipe(ctl={0: 4}))
put("ckpt", "version-float", recipe(ctl={1: 5}))
put("ckpt", "vlen-strings", recipe(ctl={23: 5, 28: 5, 33: 5}))
put("ckpt", "nullpad-strings", recipe(ctl={0: 7, 23: 7}))
put("ckpt", "n-layer-array", recipe(ctl={8: 6 | 8}))
put("ckpt", "split-long", recipe(tail=b"\x07" + b"\x02\x00\x00\x00" * 3))
put("ckpt", "split-missing", recipe(tail=b"\x01"))
put("ckpt", "vocab-intmax", recipe(ctl={5: b"\x01\x11"}))
put("ckpt", "markov-branch", recipe(ctl={35: 3}))
put("ckpt", "meta-crc-wrong", recipe(ctl={36: 3}))
put("ckpt", "markov-branch-huge", recipe(ctl={35: b"\x01\x16"}))

# config: byte 0 = preset (1 llama-tiny), then per setting (14 ints, 10 numbers) a control byte
# (0 keep, 1 edge value + index byte, 2 raw bits) -- see fuzz_config.c
put("config", "tiny", b"\x00")
put("config", "llama-tiny", b"\x01")
put("config", "llama-rope-1e30", b"\x01" + b"\x00" * 14 + b"\x00\x00" + b"\x01\x0e")   # rope-theta 1e30
put("config", "llama-eps-1", b"\x01" + b"\x00" * 14 + b"\x00" + b"\x01\x02")           # norm-eps 1
put("config", "llama-ffn-64", b"\x01" + b"\x00" * 14 + b"\x01\x0c")                      # ffn-dim-multiplier 64
put("config", "markov-branch-1", b"\x00" + b"\x00" * 13 + b"\x01\x01")
put("config", "beta2-edge", b"\x00" + b"\x00" * 14 + b"\x00" * 7 + b"\x01\x05")         # beta2 0.999999

# ---- safetensors files: 8-byte header length, JSON header, data
def st(entries, data=b"", pad=True, raw_header=None):
    import json
    h = raw_header if raw_header is not None else json.dumps(entries).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + data

f4 = struct.pack("<4f", 1, 2, 3, 4)
put("safetensors", "valid", st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                "__metadata__": {"format": "pt"}}, f4))
put("safetensors", "bf16-f16", st({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}, f4[:8]))
put("safetensors", "overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f4))
put("safetensors", "oob", st({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, f4))
put("safetensors", "bad-dtype", st({"a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, f4))
put("safetensors", "empty", st({"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}))
put("safetensors", "nan", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, struct.pack("<f", float("nan"))))
put("safetensors", "hdr-past-end", (10**6).to_bytes(8, "little") + b"{}")
put("safetensors", "not-object", st(None, raw_header=b"[1, 2]"))
put("safetensors", "dup-key", st(None, raw_header=b'{"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "a": 1}', data=f4[:4]))


# ---- BPE tokenizer files: 2-byte length, the file (tokenizer.json or tiktoken ranks), a text
def b2u():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

def tokjson(split=None, merges=("Ġ t", "h e", "Ġt he"), extra=("Ġt", "he", "Ġthe"), ignore=False, added=True):
    import json
    u = b2u()
    vocab = {u[b]: b for b in range(256)}
    for i, t in enumerate(extra):
        vocab[t] = 256 + i
    pre = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    if split:
        pre = {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated",
                                                       "invert": False}, {"type": "ByteLevel", "use_regex": False}]}
    return json.dumps({"added_tokens": [{"id": 256 + len(extra), "content": "<|endoftext|>", "special": True}] if added else [],
                       "normalizer": None, "pre_tokenizer": pre, "decoder": {"type": "ByteLevel"},
                       "model": {"type": "BPE", "ignore_merges": ignore, "vocab": vocab, "merges": list(merges)}},
                      ensure_ascii=False).encode()

def bpe_input(f, text):
    return len(f).to_bytes(2, "little") + f + text

TEXT = "the then <|endoftext|> théâtre 東京 \U0001F600  \n\n x\u180e y 123456 don't".encode() + b"\xff\xc3"
put("bpe", "gpt2-like", bpe_input(tokjson(), TEXT))
put("bpe", "llama3-like", bpe_input(tokjson(split=r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore=True), TEXT))
put("bpe", "merge-missing", bpe_input(tokjson(merges=("Ġ t", "x y")), TEXT))
put("bpe", "bad-regex", bpe_input(tokjson(split="(unclosed"), TEXT))
put("bpe", "not-byte-level", bpe_input(tokjson(extra=("Ġt", "he", "Ġthe", "\u4e00")), TEXT))
put("bpe", "ranks-short", bpe_input(b"IQ== 0\nIg== 1\n", TEXT))
put("bpe", "empty", b"")
