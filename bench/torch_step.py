#!/usr/bin/python3
"""Time one GPT-2 training step (forward + backward + AdamW) in PyTorch.

Same architecture and parameter layout as llm.c / pipelm (pre-LN blocks, tied
LM head over the first V rows of a Vp-padded wte, GELU tanh, LayerNorm eps
1e-5), random init and synthetic random tokens. Defaults are the pipelm
`tutorial` preset (V=10000, C=512, L=8, NH=8, T=128) with B=8 on one thread.

    torch_step.py [--threads 1] [--steps 8] [--warmup 2] [--json OUT.json]

Prints every step time and the median over the steps after the warm-up; with
--json also writes {"median_ms": ..., "step_ms": [...], ...}.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def build_params(V, Vp, C, L, maxT, gen):
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std

    wte = torch.zeros(Vp, C)
    wte[:V] = normal(V, C)
    P = {"wte": wte, "wpe": normal(maxT, C), "lnfw": torch.ones(C),
         "lnfb": torch.zeros(C), "layers": []}
    for _ in range(L):
        P["layers"].append({
            "ln1w": torch.ones(C), "ln1b": torch.zeros(C),
            "qkvw": normal(3 * C, C), "qkvb": torch.zeros(3 * C),
            "attprojw": normal(C, C, std=0.02 / math.sqrt(2 * L)),
            "attprojb": torch.zeros(C),
            "ln2w": torch.ones(C), "ln2b": torch.zeros(C),
            "fcw": normal(4 * C, C), "fcb": torch.zeros(4 * C),
            "fcprojw": normal(C, 4 * C, std=0.02 / math.sqrt(2 * L)),
            "fcprojb": torch.zeros(C),
        })
    return P


def all_tensors(P):
    out = [("wte", P["wte"]), ("wpe", P["wpe"])]
    for i, lay in enumerate(P["layers"]):
        out += [("%s.%d" % (k, i), v) for k, v in lay.items()]
    out += [("lnfw", P["lnfw"]), ("lnfb", P["lnfb"])]
    return out


def forward(P, idx, tgt, V, NH):
    B, T = idx.shape
    wte = P["wte"]
    C = wte.shape[1]
    hs = C // NH
    x = F.embedding(idx, wte) + P["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scale = 1.0 / math.sqrt(hs)
    for lay in P["layers"]:
        h = F.layer_norm(x, (C,), lay["ln1w"], lay["ln1b"], 1e-5)
        qkv = F.linear(h, lay["qkvw"], lay["qkvb"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * scale
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, lay["attprojw"], lay["attprojb"])
        h = F.layer_norm(x, (C,), lay["ln2w"], lay["ln2b"], 1e-5)
        h = F.gelu(F.linear(h, lay["fcw"], lay["fcb"]), approximate="tanh")
        x = x + F.linear(h, lay["fcprojw"], lay["fcprojb"])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
    logits = F.linear(x, wte[:V])
    return F.cross_entropy(logits.view(B * T, V), tgt.reshape(B * T))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--V", type=int, default=10000)
    ap.add_argument("--C", type=int, default=512)
    ap.add_argument("--L", type=int, default=8)
    ap.add_argument("--NH", type=int, default=8)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--maxT", type=int, default=0, help="default: T")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8,
                    help="total steps, including warm-up")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16) around the forward")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    maxT = a.maxT or a.T
    Vp = (a.V + 127) // 128 * 128

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    P = build_params(a.V, Vp, a.C, a.L, maxT, gen)
    named = all_tensors(P)
    for _, t in named:
        t.requires_grad_(True)
    nparams = sum(t.numel() for _, t in named)
    decay = [t for n, t in named if t.dim() == 2]
    nodecay = [t for n, t in named if t.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1},
         {"params": nodecay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    data = torch.randint(0, a.V, (a.steps, a.B, a.T + 1), generator=gen)
    print("torch %s, %d thread(s); V=%d Vp=%d C=%d L=%d NH=%d T=%d B=%d; "
          "params=%d" % (torch.__version__, torch.get_num_threads(), a.V, Vp,
                         a.C, a.L, a.NH, a.T, a.B, nparams), flush=True)
    times, losses = [], []
    for s in range(a.steps):
        idx, tgt = data[s, :, :-1], data[s, :, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(P, idx, tgt, a.V, a.NH)
        else:
            loss = forward(P, idx, tgt, a.V, a.NH)
        loss.backward()
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        times.append(dt)
        losses.append(float(loss))
        print("step %d: loss %.4f  %.1f ms%s" % (
            s + 1, losses[-1], dt, "  (warm-up)" if s < a.warmup else ""),
            flush=True)
    med = statistics.median(times[a.warmup:])
    print("torch median step: %.1f ms over %d steps" % (
        med, a.steps - a.warmup))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"median_ms": med, "step_ms": times, "loss": losses,
                       "autocast": a.autocast,
                       "warmup": a.warmup, "threads": torch.get_num_threads(),
                       "torch_version": torch.__version__, "params": nparams,
                       "config": {"V": a.V, "Vp": Vp, "C": a.C, "L": a.L,
                                  "NH": a.NH, "T": a.T, "maxT": maxT,
                                  "B": a.B}}, f)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
