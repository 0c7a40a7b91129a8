#!/usr/bin/env python3
"""Time one GPT-2 training step (forward + backward + AdamW) in PyTorch on a GPU, and the GPU's
matrix-product peak: the reference side of bench/gpu_check.sh.

Same architecture and parameter layout as llm.c / pipelm and bench/torch_step.py (pre-LN
blocks, tied LM head over the first V rows of a Vp-padded wte, GELU tanh, LayerNorm eps 1e-5,
AdamW lr 1e-3 betas (0.9, 0.95) eps 1e-8, weight decay 0.1 on 2-D weights), random init and
synthetic random tokens, fp32 master weights. Defaults: GPT-2 124M (V=50257, C=768, L=12,
NH=12), T=1024, B=8, bf16 autocast, PyTorch eager.

    torch_gpu_step.py [--B 8] [--T 1024] [--autocast bf16|none] [--attn sdpa|naive]
                      [--compile] [--steps 10] [--warmup 3] [--json OUT.json]
    torch_gpu_step.py --peak [--json OUT.json]

Steps are timed with CUDA events around the whole step (after warm-up; median reported).
--attn sdpa uses F.scaled_dot_product_attention(is_causal=True) (what nanoGPT runs); naive the
explicit q k^T, mask, softmax, att v of llm.c and torch_step.py. --peak times bf16 and TF32
8192^3 products on random data (median of 20 after 5 warm-ups).
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def build_params(V, Vp, C, L, maxT, gen, dev):
    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen) * std).to(dev)

    wte = torch.zeros(Vp, C, device=dev)
    wte[:V] = normal(V, C)
    P = {"wte": wte, "wpe": normal(maxT, C), "lnfw": torch.ones(C, device=dev),
         "lnfb": torch.zeros(C, device=dev), "layers": []}
    for _ in range(L):
        P["layers"].append({
            "ln1w": torch.ones(C, device=dev), "ln1b": torch.zeros(C, device=dev),
            "qkvw": normal(3 * C, C), "qkvb": torch.zeros(3 * C, device=dev),
            "attprojw": normal(C, C, std=0.02 / math.sqrt(2 * L)),
            "attprojb": torch.zeros(C, device=dev),
            "ln2w": torch.ones(C, device=dev), "ln2b": torch.zeros(C, device=dev),
            "fcw": normal(4 * C, C), "fcb": torch.zeros(4 * C, device=dev),
            "fcprojw": normal(C, 4 * C, std=0.02 / math.sqrt(2 * L)),
            "fcprojb": torch.zeros(C, device=dev),
        })
    return P


def all_tensors(P):
    out = [("wte", P["wte"]), ("wpe", P["wpe"])]
    for i, lay in enumerate(P["layers"]):
        out += [("%s.%d" % (k, i), v) for k, v in lay.items()]
    out += [("lnfw", P["lnfw"]), ("lnfb", P["lnfb"])]
    return out


def forward(P, idx, tgt, V, NH, attn):
    B, T = idx.shape
    wte = P["wte"]
    C = wte.shape[1]
    hs = C // NH
    x = F.embedding(idx, wte) + P["wpe"][:T]
    mask = None
    if attn == "naive":
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
    scale = 1.0 / math.sqrt(hs)
    for lay in P["layers"]:
        h = F.layer_norm(x, (C,), lay["ln1w"], lay["ln1b"], 1e-5)
        qkv = F.linear(h, lay["qkvw"], lay["qkvb"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * scale
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, lay["attprojw"], lay["attprojb"])
        h = F.layer_norm(x, (C,), lay["ln2w"], lay["ln2b"], 1e-5)
        h = F.gelu(F.linear(h, lay["fcw"], lay["fcb"]), approximate="tanh")
        x = x + F.linear(h, lay["fcprojw"], lay["fcprojb"])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
    logits = F.linear(x, wte[:V])
    return F.cross_entropy(logits.view(B * T, V).float(), tgt.reshape(B * T))


def time_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def peak(args):
    n = 8192
    out = {"device": torch.cuda.get_device_name(0), "n": n, "torch_version": torch.__version__}
    gen = torch.Generator(device="cuda").manual_seed(1)
    for name, dt, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                           ("fp32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dt, generator=gen)
        b = torch.randn(n, n, device="cuda", dtype=dt, generator=gen)
        reps = 20 if name != "fp32" else 5
        ms = time_ms(lambda: torch.matmul(a, b), 5 if name != "fp32" else 2, reps)
        out[name + "_tflops"] = 2.0 * n ** 3 / (ms / 1e3) / 1e12
        print("peak %-4s %dx%dx%d: %.3f ms, %.1f TFLOP/s" % (name, n, n, n, ms, out[name + "_tflops"]),
              flush=True)
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--V", type=int, default=50257)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--NH", type=int, default=12)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--maxT", type=int, default=0, help="default: T")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="total steps, including warm-up")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="bf16")
    ap.add_argument("--attn", choices=["sdpa", "naive"], default="sdpa")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward")
    ap.add_argument("--peak", action="store_true", help="time 8192^3 matmuls instead")
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu_step: no CUDA device visible to torch", file=sys.stderr)
        return 1
    if a.peak:
        res = peak(a)
    else:
        if a.steps <= a.warmup:
            ap.error("--steps must exceed --warmup")
        res = step(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
            f.write("\n")
    return 0


def step(a):
    dev = "cuda"
    maxT = a.maxT or a.T
    Vp = (a.V + 127) // 128 * 128
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator().manual_seed(a.seed)
    P = build_params(a.V, Vp, a.C, a.L, maxT, gen, dev)
    named = all_tensors(P)
    for _, t in named:
        t.requires_grad_(True)
    nparams = sum(t.numel() for _, t in named)
    decay = [t for n, t in named if t.dim() == 2]
    nodecay = [t for n, t in named if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    fwd = forward
    if a.compile:
        fwd = torch.compile(forward)
    data = torch.randint(0, a.V, (a.steps, a.B, a.T + 1), generator=gen).to(dev)
    print("torch %s on %s; V=%d Vp=%d C=%d L=%d NH=%d T=%d B=%d; params=%d; autocast %s, attention %s%s"
          % (torch.__version__, torch.cuda.get_device_name(0), a.V, Vp, a.C, a.L, a.NH, a.T, a.B, nparams,
             a.autocast, a.attn, ", torch.compile" if a.compile else ""), flush=True)
    times, losses = [], []
    for s in range(a.steps):
        idx, tgt = data[s, :, :-1], data[s, :, 1:]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        opt.zero_grad(set_to_none=True)
        if a.autocast == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(P, idx, tgt, a.V, a.NH, a.attn)
        else:
            loss = fwd(P, idx, tgt, a.V, a.NH, a.attn)
        loss.backward()
        opt.step()
        e1.record()
        e1.synchronize()
        dt = e0.elapsed_time(e1)
        times.append(dt)
        losses.append(float(loss))
        print("step %d: loss %.4f  %.1f ms (wall %.1f ms)%s" % (
            s + 1, losses[-1], dt, (time.perf_counter() - t0) * 1e3, "  (warm-up)" if s < a.warmup else ""),
            flush=True)
    med = statistics.median(times[a.warmup:])
    mem = torch.cuda.max_memory_allocated() / 2 ** 30
    print("torch median step: %.2f ms over %d steps; peak memory %.1f GiB" % (med, a.steps - a.warmup, mem))
    return {"median_ms": med, "step_ms": times, "loss": losses, "autocast": a.autocast, "attn": a.attn,
            "compile": a.compile, "warmup": a.warmup, "torch_version": torch.__version__, "params": nparams,
            "max_mem_gib": mem, "device": torch.cuda.get_device_name(0),
            "config": {"V": a.V, "Vp": Vp, "C": a.C, "L": a.L, "NH": a.NH, "T": a.T, "maxT": maxT, "B": a.B}}


if __name__ == "__main__":
    sys.exit(main())
