#!/usr/bin/python3
"""Independent PyTorch reference for pipelm's document masking (--doc-mask 1).

The semantics (docs/usage.md, --doc-mask): in a packed sequence a token equal to the document
token opens a document (it belongs to the document after it, as llm.c's data puts
<|endoftext|> before every document); query row t attends to the keys j with s(t) <= j <= t,
s(t) the last position <= t holding the document token (0 if none): a block-diagonal causal
mask. With --doc-positions restart the rotary position of row t is t - s(t); with continue
(the default) it stays t.

For GPT-2 and for Llama (positions restarting) this script builds a small random model with
documents crossing the CPU backend's 64-row query tiles, writes it as an llm.c model file and a
token file (the file layout through torch_ref.py's and torch_llama.py's writers), runs

    pipelm train --init model.bin --data tokens.bin --doc-mask 1 --doc-token D ... --steps 1
                 --metrics m.jsonl --dump-grads g.bin [EXTRA...]

and compares pipelm's step-1 loss (relative error <= 1e-5) and every gradient (max|a-b| /
max|b| <= 1e-5) with a float64 torch forward written here with the block-diagonal mask. It also
checks that the mask matters for the chosen data (the unmasked loss differs by more than
1e-4), so a pipelm that ignored --doc-mask would fail.

    torch_docmask.py --pipelm PATH [--launcher 'mpiexec -n 2'] [--keep DIR] [--timeout SEC]
                     [--case gpt2|llama|all] [-- EXTRA pipelm options]

Exit status: 0 PASS, 1 FAIL, 2 usage / setup error.
"""

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama as LL  # noqa: E402  (llm.c Llama file and token writers, its Config)
import torch_ref as G2  # noqa: E402  (llm.c GPT-2 file and token writers, its Config)

DOC = 5                                   # the document token of the test data
STARTS = [0, 3, 4, 40, 63, 64, 65, 70]     # where sequence 0 holds it (tile edges 63 | 64)
B, T = 2, 80                               # sequence 1 holds none: plain causal


def doc_starts(inp):
    """(B, T) int64: the first position of each row's document in its sequence."""
    s = np.zeros(inp.shape, dtype=np.int64)
    for b in range(inp.shape[0]):
        cur = 0
        for t in range(inp.shape[1]):
            if inp[b, t] == DOC:
                cur = t
            s[b, t] = cur
    return s


def visible(starts):
    """(B, 1, T, T) bool: key j visible to row t."""
    t = torch.arange(T)
    causal = t[None, :] <= t[:, None]
    s = torch.as_tensor(starts)
    return (causal[None] & (t[None, None, :] >= s[:, :, None]))[:, None]


def attention(q, k, v, mask):
    """q, k, v (B, heads, T, hs); softmax over the visible keys only."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def gpt2_loss(cfg, P, inp, tgt, mask):
    wte, wpe, l1w, l1b, qw, qb, aw, ab, l2w, l2b, fw, fb, pw, pb, nw, nb = P
    C, NH = cfg.C, cfg.NH
    hs = C // NH

    def ln(x, w, b):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(v + 1e-5) * w + b

    x = wte[inp] + wpe[:T]
    for l in range(cfg.L):
        qkv = ln(x, l1w[l], l1b[l]) @ qw[l].t() + qb[l]
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, NH, hs).transpose(1, 2) for i in range(3))
        x = x + attention(q, k, v, mask).transpose(1, 2).reshape(B, T, C) @ aw[l].t() + ab[l]
        h = ln(x, l2w[l], l2b[l]) @ fw[l].t() + fb[l]
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ pw[l].t() + pb[l]
    logits = ln(x, nw, nb) @ wte[:cfg.V].t()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.V), tgt.reshape(-1))


def llama_loss(cfg, P, inp, tgt, mask, pos):
    """pos (B, T): each row's rotary position."""
    wte, an, qkvw, apw, mn, fcw, fc2w, fpw, nf, head = P
    NH, NKV, hs, C, eps = cfg.NH, cfg.NKV, cfg.HS, cfg.C, cfg.eps
    f = torch.tensor([1.0 / cfg.theta ** (2.0 * j / hs) for j in range(hs // 2)], dtype=torch.float64)
    ang = torch.as_tensor(pos, dtype=torch.float64)[..., None] * f          # (B, T, hs/2)
    rot = torch.polar(torch.ones_like(ang), ang)[:, :, None, :]              # (B, T, 1, hs/2)

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def rope(x):   # interleaved pairs (x[2i], x[2i+1]) as complex numbers
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * rot).flatten(3)

    x = wte[inp]
    for l in range(cfg.L):
        q, k, v = (rms(x, an[l]) @ qkvw[l].t()).split([NH * hs, NKV * hs, NKV * hs], dim=-1)
        q = rope(q.reshape(B, T, NH, hs)).transpose(1, 2)
        k = rope(k.reshape(B, T, NKV, hs)).repeat_interleave(NH // NKV, dim=2).transpose(1, 2)
        v = v.reshape(B, T, NKV, hs).repeat_interleave(NH // NKV, dim=2).transpose(1, 2)
        x = x + attention(q, k, v, mask).transpose(1, 2).reshape(B, T, C) @ apw[l].t()
        h = rms(x, mn[l])
        x = x + ((h @ fcw[l].t()) * torch.nn.functional.silu(h @ fc2w[l].t())) @ fpw[l].t()
    logits = rms(x, nf) @ head.t()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.V), tgt.reshape(-1))


def loss_grads(fn, params, *a):
    P = [torch.tensor(p, requires_grad=True) for p in params]
    loss = fn(P, *a)
    loss.backward()
    return float(loss), [None if p.grad is None else p.grad.numpy().copy() for p in P]


def tokens_for(V, seed):
    rng = np.random.RandomState(seed)
    tok = rng.randint(0, V, size=B * T + 1 + 50).astype(np.int64)
    tok[tok == DOC] = DOC + 1
    for t in STARTS:
        tok[t] = DOC
    return tok


def run_pipelm(args, work, model, data, extra):
    metrics, grads = os.path.join(work, "m.jsonl"), os.path.join(work, "g.bin")
    for f in (metrics, grads):
        if os.path.exists(f):
            os.remove(f)
    cmd = (["timeout", str(args.timeout)] if args.timeout > 0 and shutil.which("timeout") else [])
    cmd += shlex.split(args.launcher) + [
        args.pipelm, "train", "--init", model, "--data", data, "--batch", str(B), "--seq-len", str(T), "--steps",
        "1", "--microbatches", "1", "--lr", "1e-3", "--lr-schedule", "constant", "--warmup-steps", "0",
        "--grad-clip", "0", "--eval-every", "0", "--progress", "0", "--doc-mask", "1", "--doc-token", str(DOC),
        "--metrics", metrics, "--dump-grads", grads] + extra + args.extra
    print("running: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(r.stdout.decode("utf-8", "replace")[-3000:])
        return None, None
    loss = None
    for line in open(metrics):
        d = json.loads(line)
        if d.get("event") == "step" and loss is None:
            loss = float(d["loss"])
    return loss, grads


def compare(label, loss, ref_loss, nomask_loss, names, got, ref, tol):
    fails = []
    e = abs(loss - ref_loss) / abs(ref_loss)
    print("  loss: pipelm %.10f  torch %.10f  rel.err %.2e  (unmasked torch %.10f)" % (loss, ref_loss, e,
                                                                                   nomask_loss))
    if e > tol:
        fails.append("%s: loss rel.err %.2e" % (label, e))
    if abs(nomask_loss - ref_loss) < 1e-4 * abs(ref_loss):
        fails.append("%s: the mask does not change the loss: the test data cannot tell" % label)
    for name, a, b in zip(names, got, ref):
        if b is None:
            continue
        err = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)
        print("  %-10s rel.err %.2e  %s" % (name, err, "ok" if err <= tol else "FAIL"))
        if err > tol:
            fails.append("%s: gradient %s rel.err %.2e" % (label, name, err))
    return fails


def case_gpt2(args, work):
    print("\n=== gpt2: block-diagonal mask, positions continue ===")
    cfg = G2.Config(V=64, C=32, L=2, NH=4, maxT=T)
    params = G2.random_model(cfg, 4040)
    tok = tokens_for(cfg.V, 40)
    model, data = os.path.join(work, "gpt2.bin"), os.path.join(work, "gpt2_tok.bin")
    G2.write_model(model, cfg, params)
    G2.write_tokens(data, tok)
    inp, tgt = (torch.as_tensor(a) for a in G2.batch(tok, 0, B, T))
    starts = doc_starts(inp.numpy())
    fn = lambda P, m: gpt2_loss(cfg, P, inp, tgt, m)  # noqa: E731
    ref_loss, ref = loss_grads(fn, params, visible(starts))
    with torch.no_grad():
        nomask = float(fn([torch.tensor(p) for p in params], visible(np.zeros_like(starts))))
    loss, gpath = run_pipelm(args, work, model, data, [])
    if loss is None:
        return ["gpt2: pipelm failed"]
    got = G2.read_model(gpath)[2]
    return compare("gpt2", loss, ref_loss, nomask, G2.NAMES, got, ref, args.tol)


def case_llama(args, work):
    print("\n=== llama: block-diagonal mask, rotary positions restarting ===")
    cfg = LL.Config(V=61, C=48, L=2, NH=6, NKV=2, maxT=T, multiple_of=16, ffn_mult=0, eps=1e-5, theta=10000.0,
                    scaled=False)
    params = LL.random_model(cfg, 4141)
    tok = tokens_for(cfg.V, 41)
    model, data = os.path.join(work, "llama.bin"), os.path.join(work, "llama_tok.bin")
    LL.write_model(model, cfg, params)
    LL.write_tokens(data, tok)
    inp, tgt = (torch.as_tensor(a) for a in LL.batch(tok, 0, B, T))
    starts = doc_starts(inp.numpy())
    pos = np.arange(T)[None, :] - starts
    fn = lambda P, m, p: llama_loss(cfg, P, inp, tgt, m, p)  # noqa: E731
    ref_loss, ref = loss_grads(fn, params, visible(starts), pos)
    with torch.no_grad():
        z = np.zeros_like(starts)
        nomask = float(fn([torch.tensor(p) for p in params], visible(z), np.arange(T)[None, :] + z))
    loss, gpath = run_pipelm(args, work, model, data, ["--doc-positions", "restart"])
    if loss is None:
        return ["llama: pipelm failed"]
    got = LL.read_model(gpath, cfg)
    return compare("llama", loss, ref_loss, nomask, LL.NAMES, got, ref, args.tol)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipelm", required=True)
    ap.add_argument("--launcher", default="")
    ap.add_argument("--keep", default="")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--case", default="all", choices=["gpt2", "llama", "all"])
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="torch_docmask.")
    os.makedirs(work, exist_ok=True)
    try:
        fails = []
        if args.case in ("gpt2", "all"):
            fails += case_gpt2(args, work)
        if args.case in ("llama", "all"):
            fails += case_llama(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if fails:
        print("FAIL: " + "; ".join(fails))
        return 1
    print("PASS: document masking matches the torch reference (loss and every gradient within %g)" % args.tol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
