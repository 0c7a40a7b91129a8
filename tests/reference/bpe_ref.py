#!/usr/bin/env python3
"""bpe_ref.py — the plain tier's tokenizer fixture and its independent encoder, written from the
definitions of byte-level BPE (GPT-2's bytes_to_unicode, merges by rank, Hugging Face's
tokenizer.json layout), not from pipelm's code. Needs Python's `regex` module (python3-regex)
for the pre-tokenizer's Unicode classes.

  bpe_ref.py fixture OUT.json TRAIN.txt NMERGES gpt2|llama3
      trains NMERGES merges on TRAIN.txt (the most frequent pair first, ties to the smallest ids)
      and writes a tokenizer.json: ByteLevel with GPT-2's regex (gpt2), or a Split with Llama 3's
      regex and ignore_merges, plus the 8 most frequent pieces that no merge makes (llama3);
      <|endoftext|> is the added special token after them
  bpe_ref.py encode TOKENIZER.json OUT.bin FILE...
      one llm.c shard (uint16): per FILE, <|endoftext|>, then its text encoded (no special tokens)
  bpe_ref.py hard OUT.txt KB SEED
      KB kilobytes of the generated hard cases alone (to train fixtures whose merges reach them)
  bpe_ref.py corpus OUTDIR MB SEED
      about MB megabytes of varied UTF-8 documents doc_NNNN.txt: the Python library's sources
      and the system's licence texts, mixed with generated CJK, emoji, combining marks, long
      whitespace runs, digits, contractions in any case and text around special-token strings
"""
import glob
import json
import random
import struct
import sys

import regex

PATS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {c: b for b, c in B2U.items()}


def fixture(out, train, nmerges, kind):
    text = open(train, encoding="utf-8").read()
    words = {}
    for w in regex.findall(PATS[kind], text):
        t = tuple(w.encode("utf-8"))
        words[t] = words.get(t, 0) + 1
    tokens = [bytes([b]) for b in range(256)]
    merges = []
    seqs = {w: list(w) for w in words}
    for _ in range(nmerges):
        pairs = {}
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + words[w]
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        merges.append((a, b))
        for w, s in seqs.items():
            i, o = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    o.append(new)
                    i += 2
                else:
                    o.append(s[i])
                    i += 1
            seqs[w] = o
    if kind == "llama3":  # the 8 most frequent pieces no merge makes: only ignore_merges finds them
        have = set(tokens)
        for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:400]:
            b = bytes(w)
            if len(b) >= 3 and b not in have and len(tokens) < 256 + nmerges + 8:
                tokens.append(b)
                have.add(b)
    u = lambda t: "".join(B2U[x] for x in t)
    vocab = {u(t): i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATS[kind]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": len(tokens), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}],
          "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": kind == "llama3", "vocab": vocab,
                    "merges": [u(tokens[a]) + " " + u(tokens[b]) for a, b in merges]}}
    json.dump(tj, open(out, "w"), ensure_ascii=False)


def encoder(path):
    tj = json.load(open(path, encoding="utf-8"))
    m = tj["model"]
    vocab = {bytes(U2B[c] for c in s): i for s, i in m["vocab"].items()}
    rank = {}
    for r, mg in enumerate(m["merges"]):
        a, b = mg.split(" ") if isinstance(mg, str) else mg
        rank.setdefault((bytes(U2B[c] for c in a), bytes(U2B[c] for c in b)), r)
    pre = tj["pre_tokenizer"]
    pat = PATS["gpt2"] if pre["type"] == "ByteLevel" else pre["pretokenizers"][0]["pattern"]["Regex"]
    eot = [a["id"] for a in tj["added_tokens"] if a["content"] == "<|endoftext|>"][0]
    return vocab, rank, regex.compile(pat), m.get("ignore_merges", False), eot


def bpe(piece, vocab, rank, ignore):
    if ignore and piece in vocab:
        return [vocab[piece]]
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best = min(range(len(parts) - 1), key=lambda i: (rank.get((parts[i], parts[i + 1]), 1 << 62), i))
        if (parts[best], parts[best + 1]) not in rank:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [vocab[p] for p in parts]


def encode(path, out, files):
    vocab, rank, pat, ignore, eot = encoder(path)
    toks = []
    for f in files:
        toks.append(eot)
        for w in pat.findall(open(f, encoding="utf-8", newline="").read()):
            toks += bpe(w.encode("utf-8"), vocab, rank, ignore)
    with open(out, "wb") as fo:
        fo.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        fo.write(struct.pack("<%dH" % len(toks), *toks))


def generated(rng, n):
    """n characters of the hard cases, mixed."""
    s = []
    pick = [
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 30))),  # CJK
        lambda: "".join(chr(rng.randint(0x3040, 0x30FF)) for _ in range(rng.randint(1, 10))),  # kana
        lambda: "".join(rng.choice(["\U0001F600", "\U0001F680", "\u2764\uFE0F", "\U0001F44D\U0001F3FD",
                                    "\U0001F1FA\U0001F1F8", "\U0001F468\u200D\U0001F469\u200D\U0001F467"])
                        for _ in range(rng.randint(1, 5))),  # emoji, ZWJ sequences, flags
        lambda: " " * rng.randint(1, 300) + rng.choice(["", "\n", "\t", "\r\n", "\n\n\n"]),  # whitespace runs
        lambda: str(rng.randint(0, 10 ** rng.randint(1, 25))) + rng.choice(["", ".", ",", " "]),  # digits
        lambda: rng.choice(["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|endo",
                            "<|", "|>", "<|fim_prefix|>", "<||>"]),  # around special-token strings
        lambda: rng.choice(["don't", "I'LL", "WE'VE", "it's", "She'd", "'s", "ſ", "K", "Straße", "naïve", "e\u0301",
                            "Ωμέγα", "привет", "مرحبا", "שלום", "नमस्ते", "ภาษาไทย", "한국어", "\u00a0", "\u2028",
                            "\u3000", "\x0b", "\x0c", "\x85", "\u200b", "\ufeff", "\u180e", "½", "Ⅻ", "①", "٣"]),
        lambda: rng.choice([" ", "", "x"]) + rng.choice(["\u180e", "\u200b", "\ufeff", "\x85", "\xa0", "\u2028",
                                                       "\u3000", "\x1c", "\x1f", "\u2007"]) + rng.choice([" ", "", "y"]),
        lambda: " " + rng.choice(["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]) +
                rng.choice([".", ",", "!?", "...", ":", " -- ", "''", "\n"]),
    ]
    while sum(map(len, s)) < n:
        s.append(rng.choice(pick)())
    return "".join(s)


def corpus(outdir, mb, seed):
    rng = random.Random(seed)
    srcs = sorted(glob.glob("/usr/lib/python3*/*.py")) + sorted(glob.glob("/usr/share/common-licenses/*"))
    texts = []
    for p in srcs:
        try:
            texts.append(open(p, encoding="utf-8", errors="replace").read())
        except OSError:
            pass
    want, k, total = int(mb * 1e6), 0, 0
    while total < want:
        t = texts[k % len(texts)] if texts else ""
        a = rng.randint(0, max(0, len(t) - 1))
        doc = t[a:a + rng.randint(2000, 60000)] + generated(rng, rng.randint(500, 8000))
        if rng.random() < 0.3:
            doc = generated(rng, 2000) + doc
        data = doc.encode("utf-8")
        open("%s/doc_%04d.txt" % (outdir, k), "wb").write(data)
        total += len(data)
        k += 1


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "fixture":
        fixture(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif cmd == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "hard":
        open(sys.argv[2], "w", encoding="utf-8").write(generated(random.Random(int(sys.argv[4])), int(sys.argv[3]) * 1000))
    elif cmd == "corpus":
        corpus(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
