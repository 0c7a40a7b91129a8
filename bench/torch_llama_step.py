#!/usr/bin/python3
"""Time one Llama 3 training step (forward + backward + AdamW) in PyTorch on the CPU.

The architecture pipelm's `--arch llama` trains (RMSNorm, rotary embeddings on interleaved
pairs, grouped-query attention, SwiGLU, untied head over a Vp-padded vocabulary), random init
and random tokens, fp32 or bf16 autocast (bf16 matmul inputs, fp32 master weights: what
pipelm's onednn bf16 does).

    torch_llama_step.py --V 256 --C 72 --L 4 --NH 6 --NKV 2 --H 192 --T 64 --B 16
                        [--bf16] [--threads 1] [--steps 5] [--warmup 2] [--json OUT]
"""

import argparse
import contextlib
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def step_fn(a, P, fc, inp, tgt):
    B, T = inp.shape
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    hs = a.C // a.NH
    x = P["wte"][inp]
    for lp in P["layers"]:
        h = rmsnorm(x, lp["n1"])
        q, k, v = (h @ lp["qkv"].t()).split([a.NH * hs, a.NKV * hs, a.NKV * hs], dim=-1)
        q = torch.view_as_real(torch.view_as_complex(q.float().reshape(B, T, a.NH, hs // 2, 2)) * fc).flatten(3)
        k = torch.view_as_real(torch.view_as_complex(k.float().reshape(B, T, a.NKV, hs // 2, 2)) * fc).flatten(3)
        v = v.reshape(B, T, a.NKV, hs)
        k = k.repeat_interleave(a.NH // a.NKV, dim=2)
        v = v.repeat_interleave(a.NH // a.NKV, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = (q @ k.to(q.dtype).transpose(-1, -2)) * (1.0 / math.sqrt(hs))
        y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v.to(q.dtype)
        x = x + y.transpose(1, 2).reshape(B, T, a.C) @ lp["ap"].t()
        h = rmsnorm(x, lp["n2"])
        x = x + ((h @ lp["fc"].t()) * F.silu(h @ lp["fc2"].t())) @ lp["fp"].t()
    logits = rmsnorm(x, P["nf"]) @ P["head"][:a.V].t()
    return F.cross_entropy(logits.float().reshape(-1, a.V), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, d in (("V", 256), ("C", 72), ("L", 4), ("NH", 6), ("NKV", 2), ("H", 192), ("T", 64), ("B", 16)):
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    Vp = (a.V + 127) // 128 * 128
    hs = a.C // a.NH

    def n(*s, std=0.02):
        return (torch.randn(*s, generator=g) * std).requires_grad_()
    P = {"wte": n(Vp, a.C), "head": n(Vp, a.C), "nf": torch.ones(a.C, requires_grad=True), "layers": []}
    for _ in range(a.L):
        P["layers"].append({"n1": torch.ones(a.C, requires_grad=True), "n2": torch.ones(a.C, requires_grad=True),
                            "qkv": n((a.NH + 2 * a.NKV) * hs, a.C), "ap": n(a.C, a.C), "fc": n(a.H, a.C),
                            "fc2": n(a.H, a.C), "fp": n(a.C, a.H)})
    params = [P["wte"], P["head"], P["nf"]] + [t for lp in P["layers"] for t in lp.values()]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    f = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    ang = torch.outer(torch.arange(a.T, dtype=torch.float64), f)
    fc = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)[None, :, None, :]
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    times = []
    for s in range(a.warmup + a.steps):
        inp = torch.randint(0, a.V, (a.B, a.T), generator=g)
        tgt = torch.randint(0, a.V, (a.B, a.T), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx:
            loss = step_fn(a, P, fc, inp, tgt)
        loss.backward()
        opt.step()
        ms = 1e3 * (time.perf_counter() - t0)
        print("step %d: %.1f ms loss %.4f" % (s + 1, ms, float(loss)), flush=True)
        if s >= a.warmup:
            times.append(ms)
    med = statistics.median(times)
    print("median %.1f ms" % med)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"median_ms": med, "step_ms": times, "bf16": a.bf16}, fh)


if __name__ == "__main__":
    main()
