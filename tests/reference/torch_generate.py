#!/usr/bin/env python3
"""torch_generate.py -- pipelm generate against an independent PyTorch decode.

For a GPT-2 and a Llama model of odd shapes (random weights written as llm.c files with the
writers of torch_ref.py and torch_llama.py), a greedy decode in float64 with an explicit
key/value cache (each step feeds one token and appends its keys and values) gives the first
--steps tokens and the logits of every step for several prompts; pipelm generate on the same
file (--logits-out, --tokens-out) must give the same tokens and logits within --tol. The
cached decode is first checked against a full recompute of the prefix at every step.

  torch_generate.py --pipelm build/pipelm [--ranks 1,2] [--mpiexec mpiexec] [--steps 20]
  torch_generate.py --bench FILE --prompt IDS --steps N   (one thread, float32: tokens/s of
      torch's cached greedy decode on an llm.c GPT-2 file, printed as JSON)
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (GPT-2: Config, random_model, write_model, layernorm, gelu_tanh)
import torch_llama  # noqa: E402  (Llama: Config, random_model, write_model, rmsnorm, rope_freqs)


def gpt2_step(cfg, P, tok, pos, cache):
    """Logits (n, V) of tokens tok (n,) at positions pos.., appending to cache[l] = (K, V)."""
    wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = P
    C, NH = cfg.C, cfg.NH
    hs, n = C // NH, len(tok)
    x = wte[tok] + wpe[pos:pos + n]
    for l in range(cfg.L):
        h = torch_ref.layernorm(x, ln1w[l], ln1b[l])
        qkv = h @ qkvw[l].t() + qkvb[l]
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(n, NH, hs).transpose(0, 1) for i in range(3))
        K, Vv = cache[l]
        K = k if K is None else torch.cat([K, k], dim=1)
        Vv = v if Vv is None else torch.cat([Vv, v], dim=1)
        cache[l] = (K, Vv)
        s = (q @ K.transpose(-1, -2)) / math.sqrt(hs)               # (NH, n, pos+n)
        mask = torch.arange(pos + n)[None, :] <= (pos + torch.arange(n))[:, None]
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        y = (a @ Vv).transpose(0, 1).reshape(n, C)
        x = x + y @ apw[l].t() + apb[l]
        h = torch_ref.layernorm(x, ln2w[l], ln2b[l])
        x = x + torch_ref.gelu_tanh(h @ fcw[l].t() + fcb[l]) @ fpw[l].t() + fpb[l]
    return torch_ref.layernorm(x, lnfw, lnfb) @ wte[:cfg.V].t()


def llama_step(cfg, P, tok, pos, cache):
    """As gpt2_step for Llama 3 (RoPE at the absolute positions, grouped-query attention)."""
    wte, an, qkvw, apw, mn, fcw, fc2w, fpw, nf, head = P
    NH, NKV, hs, C, n = cfg.NH, cfg.NKV, cfg.HS, cfg.C, len(tok)
    fc = torch_llama.rope_freqs(cfg, pos + n)[pos:pos + n]
    x = wte[tok]
    for l in range(cfg.L):
        h = torch_llama.rmsnorm(x, an[l], cfg.eps)
        q, k, v = (h @ qkvw[l].t()).split([NH * hs, NKV * hs, NKV * hs], dim=-1)
        q = torch_llama.rotate(q.reshape(1, n, NH, hs), fc)[0].transpose(0, 1)
        k = torch_llama.rotate(k.reshape(1, n, NKV, hs), fc)[0].transpose(0, 1)
        v = v.reshape(n, NKV, hs).transpose(0, 1)
        K, Vv = cache[l]
        K = k if K is None else torch.cat([K, k], dim=1)
        Vv = v if Vv is None else torch.cat([Vv, v], dim=1)
        cache[l] = (K, Vv)
        rep = NH // NKV
        s = (q @ K.repeat_interleave(rep, 0).transpose(-1, -2)) / math.sqrt(hs)
        mask = torch.arange(pos + n)[None, :] <= (pos + torch.arange(n))[:, None]
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        y = (a @ Vv.repeat_interleave(rep, 0)).transpose(0, 1).reshape(n, C)
        x = x + y @ apw[l].t()
        h = torch_llama.rmsnorm(x, mn[l], cfg.eps)
        x = x + (h @ fcw[l].t() * torch.nn.functional.silu(h @ fc2w[l].t())) @ fpw[l].t()
    return torch_llama.rmsnorm(x, nf, cfg.eps) @ head.t()


def greedy(step, cfg, P, prompt, steps, cached=True):
    """The first `steps` greedy tokens and each step's logits (V,) of one prompt."""
    cache = [(None, None)] * cfg.L
    logits = step(cfg, P, torch.tensor(prompt), 0, cache)[-1]
    seq, toks, out = list(prompt), [], []
    for _ in range(steps):
        out.append(logits)
        t = int(torch.argmax(logits))
        toks.append(t)
        seq.append(t)
        if cached:
            logits = step(cfg, P, torch.tensor([t]), len(seq) - 1, cache)[-1]
        else:
            logits = step(cfg, P, torch.tensor(seq), 0, [(None, None)] * cfg.L)[-1]
    return toks, out


def run_pipelm(args, ranks, model, prompts, extra, work):
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.write("".join(",".join(map(str, p)) + "\n" for p in prompts))
    tk, lg = os.path.join(work, "tok.txt"), os.path.join(work, "logits.txt")
    cmd = [args.mpiexec, "-n", str(ranks), args.pipelm, "generate", "--init", model, "--prompt-file", pf,
           "--max-new-tokens", str(args.steps), "--tokens-out", tk, "--logits-out", lg] + extra
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    toks = [[int(t) for t in line.split(",") if t] for line in open(tk).read().splitlines()]
    rows = {}
    for line in open(lg):
        v = line.split(",")
        rows[(int(v[0]), int(v[1]))] = np.array([float(x) for x in v[3:]])
    return toks, rows


def case(args, name, step, cfg, P, model, prompts):
    fails = 0
    ref = [greedy(step, cfg, P, p, args.steps) for p in prompts]
    full = greedy(step, cfg, P, prompts[0], args.steps, cached=False)
    d = max(float((a - b).abs().max()) for a, b in zip(ref[0][1], full[1]))
    if full[0] != ref[0][0] or d > 1e-9:
        print("FAIL - %s: the torch cached decode differs from its recompute (%g)" % (name, d))
        fails += 1
    for ranks in args.ranks:
        for extra in ([], ["--prefill-chunk", "3", "--groups", "2"]):
            with tempfile.TemporaryDirectory() as work:
                toks, rows = run_pipelm(args, ranks, model, prompts, extra, work)
            worst = 0.0
            for q, p in enumerate(prompts):
                for i, lt in enumerate(ref[q][1]):
                    got = rows.get((q, len(p) + i))
                    worst = max(worst, float(np.abs(got - lt.numpy()).max()) if got is not None else math.inf)
            same = toks == [r[0] for r in ref]
            tag = "%s P=%d %s" % (name, ranks, " ".join(extra) or "(one chunk)")
            if same and worst <= args.tol:
                print("ok   - %s: %d greedy tokens of %d prompts equal torch's, logits within %.1e" %
                      (tag, args.steps, len(prompts), worst))
            else:
                print("FAIL - %s: tokens %s, worst logit difference %g" % (tag, "equal" if same else "differ", worst))
                fails += 1
    return fails


def compare(args):
    torch.set_default_dtype(torch.float64)
    fails = 0
    with tempfile.TemporaryDirectory() as work:
        g = torch_ref.Config(V=97, C=48, L=3, NH=3, maxT=48)
        gp = torch_ref.random_model(g, 11)
        gm = os.path.join(work, "gpt2.bin")
        torch_ref.write_model(gm, g, gp)
        prompts = [[5, 17, 3, 90, 41, 2, 7], [60], [8, 8, 12, 30]]
        fails += case(args, "GPT-2 V=97 C=48 L=3 NH=3", gpt2_step, g, [torch.tensor(p) for p in gp], gm, prompts)
        c = torch_llama.Config(V=97, C=60, L=3, NH=6, NKV=2, maxT=48, multiple_of=16, ffn_mult=1.3, eps=1e-5,
                               theta=20000.0, scaled=True)
        lp = torch_llama.random_model(c, 12)
        lm = os.path.join(work, "llama.bin")
        torch_llama.write_model(lm, c, lp)
        fails += case(args, "Llama V=97 C=60 L=3 NH=6 NKV=2", llama_step, c, [torch.tensor(p) for p in lp], lm,
                      prompts)
    return 1 if fails else 0


def bench(args):
    """One thread, float32: torch's cached greedy decode on an llm.c GPT-2 file."""
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    cfg, _h, params = torch_ref.read_model(args.bench)
    P = [torch.tensor(p, dtype=torch.float32) for p in params]
    prompt = [int(t) for t in args.prompt.split(",")]
    with torch.no_grad():
        t0 = time.perf_counter()
        cache = [(None, None)] * cfg.L
        logits = gpt2_step(cfg, P, torch.tensor(prompt), 0, cache)[-1]
        t1 = time.perf_counter()
        n = len(prompt)
        for i in range(args.steps - 1):
            t = int(torch.argmax(logits))
            logits = gpt2_step(cfg, P, torch.tensor([t]), n + i, cache)[-1]
        t2 = time.perf_counter()
    print(json.dumps({"torch_ttft_ms": (t1 - t0) * 1e3, "torch_decode_tok_s": (args.steps - 1) / (t2 - t1)}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelm")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--bench")
    ap.add_argument("--prompt", default="1,2,3")
    args = ap.parse_args()
    args.ranks = [int(r) for r in args.ranks.split(",")]
    if args.bench:
        return bench(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
