#!/usr/bin/python3
"""Independent PyTorch reference for pipelm's Llama 3 (as llm.c's train_llama3.py defines it).

Builds a small random Llama with odd shapes (n_head 6, n_kv_head 2, a head size that is not a
power of two, T = 7, a padded vocabulary, ffn_dim_multiplier and Llama 3.1 rope scaling on),
writes it as an llm.c Llama 3 model file (magic 20240803) and an llm.c uint32 token file
(magic 20240801), runs

    pipelm train --init model.bin --data tokens.bin ... --metrics m.jsonl --dump-grads g.bin

and compares pipelm's losses of 5 AdamW steps and every step-1 gradient (read back from the
llm.c Llama file pipelm writes) with a float64 torch computation of the same thing. The model
below is written here from the definition, not taken from pipelm: RMSNorm, rotary embeddings
on interleaved pairs (as complex numbers), grouped-query attention by repeating the kv heads,
SwiGLU with c_fc2 as the gate through silu, an untied lm_head. Before comparing, the
reference's own gradients are checked against central finite differences.

    torch_llama.py --pipelm PATH [--keep DIR] [--timeout SEC] [--self-check all|first]
    torch_llama.py --pipelm PATH --hf | --only-hf   (also / only: the model as Hugging Face files)
    torch_llama.py --write-model OUT [--version 3|5]   (a model file for other tests)
    torch_llama.py --write-hf DIR [--hf-dtype F32|BF16|F16] [--tied]   (a Hugging Face directory)
    torch_llama.py --check-bf16 FILE   (FILE, fp32, holds the test model rounded to bf16)

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
import st_write  # noqa: E402  (the independent safetensors writer)

MODEL_MAGIC = 20240803
TOKEN_MAGIC = 20240801
NAMES = ["wte", "attn_norm", "qkv", "attproj", "mlp_norm", "fc", "fc2", "fcproj", "norm_f", "lm_head"]
DECAY = {"wte", "qkv", "attproj", "fc", "fc2", "fcproj", "lm_head"}   # the matrices


class Config:
    def __init__(self, V, C, L, NH, NKV, maxT, multiple_of, ffn_mult, eps, theta, scaled, tied=False,
                 rope=(8.0, 1.0, 4.0, 8192)):
        assert C % NH == 0 and NH % NKV == 0 and (C // NH) % 2 == 0
        self.V, self.C, self.L, self.NH, self.NKV, self.maxT = V, C, L, NH, NKV, maxT
        self.multiple_of, self.ffn_mult, self.scaled = multiple_of, ffn_mult, scaled
        self.tied, self.rope = tied, rope   # lm_head is wte (Llama 3.2); rope_scaling (factor, low, high, orig)
        # the header holds float32: use exactly those values
        self.eps = float(np.float32(eps))
        self.theta = float(np.float32(theta))
        self.HS = C // NH
        h = int(2 * 4 * C / 3)
        if ffn_mult > 0:
            h = int(float(np.float32(ffn_mult)) * h)
        self.H = multiple_of * ((h + multiple_of - 1) // multiple_of)
        self.QKV = (NH + 2 * NKV) * self.HS

    def shapes(self):
        V, C, L, H = self.V, self.C, self.L, self.H
        return [(V, C), (L, C), (L, self.QKV, C), (L, C, C), (L, C), (L, H, C), (L, H, C),
                (L, C, H), (C,), (V, C)]

    def header(self, version):
        hi = np.zeros(256, dtype="<i4")
        hi[:12] = [MODEL_MAGIC, version, self.maxT, self.V, self.L, self.NH, self.NKV, self.C,
                   self.multiple_of, int(self.scaled), 3, 1]
        hf = np.zeros(256, dtype="<f4")
        hf[:3] = [self.ffn_mult, self.eps, self.theta]
        return hi, hf


def to_bf16_bits(a):
    """fp32 -> bf16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2")


def llmc_blocks(cfg, params):
    """The tensors of an llm.c Llama 3 file in the order train_llama3.py's write_tensors
    writes them: GPT-2's 16 slots, lm_head in wpe's, zeros in the bias slots, c_fc (up) and
    c_fc2 (gate) packed per layer into fcw (L, 2H, C)."""
    wte, an, qkv, ap, mn, fc, fc2, fp, nf, lm = params
    L = cfg.L
    z = lambda *s: np.zeros(s)
    return [wte, lm, an, z(L, cfg.C), qkv, z(L, cfg.QKV), ap, z(L, cfg.C), mn, z(L, cfg.C),
            np.concatenate([fc, fc2], axis=1), z(L, 2 * cfg.H), fp, z(L, cfg.C), nf, z(cfg.C)]


def write_model(path, cfg, params, version=3):
    hi, hf = cfg.header(version)
    for shape, p in zip(cfg.shapes(), params):
        assert p.shape == tuple(shape)
    with open(path, "wb") as f:
        hi.tofile(f)
        hf.tofile(f)
        for p in llmc_blocks(cfg, params):
            if version == 3:
                np.ascontiguousarray(p, dtype="<f4").tofile(f)
            else:
                to_bf16_bits(p).tofile(f)


def read_model(path, cfg, hf=False):
    raw = open(path, "rb").read()
    hi = np.frombuffer(raw[:1024], dtype="<i4").copy()
    hf_ = np.frombuffer(raw[1024:2048], dtype="<f4").copy()
    want_i, want_f = cfg.header(3)
    if hf:   # from config.json's intermediate_size: multiple_of = H, no ffn multiplier
        want_i[8], want_f[0] = cfg.H, 0
    if not np.array_equal(hi, want_i):
        raise ValueError("%s: int header differs at %s" % (path, np.nonzero(hi != want_i)[0][:8]))
    if not np.array_equal(hf_, want_f):
        raise ValueError("%s: float header differs" % path)
    flat = np.frombuffer(raw[2048:], dtype="<f4").astype(np.float64)
    shapes = [b.shape for b in llmc_blocks(cfg, [np.zeros(s) for s in cfg.shapes()])]
    n = sum(int(np.prod(s)) for s in shapes)
    if flat.size != n:
        raise ValueError("%s: %d floats after the header, expected %d" % (path, flat.size, n))
    got, off = [], 0
    for s in shapes:
        k = int(np.prod(s))
        got.append(flat[off:off + k].reshape(s))
        off += k
    for i in (3, 5, 7, 9, 11, 13, 15):
        if np.any(got[i] != 0):
            raise ValueError("%s: bias slot %d is not zero" % (path, i))
    H = cfg.H
    return [got[0], got[2], got[4], got[6], got[8], got[10][:, :H], got[10][:, H:], got[12], got[14], got[1]]


def write_tokens(path, tokens):
    h = np.zeros(256, dtype="<i4")
    h[:3] = [TOKEN_MAGIC, 7, len(tokens)]
    with open(path, "wb") as f:
        h.tofile(f)
        np.asarray(tokens, dtype="<u4").tofile(f)


def random_model(cfg, seed):
    rng = np.random.RandomState(seed)
    n = rng.standard_normal
    V, C, L, H, Q = cfg.V, cfg.C, cfg.L, cfg.H, cfg.QKV
    p = [0.1 * n((V, C)), 1.0 + 0.1 * n((L, C)), 0.15 * n((L, Q, C)), 0.06 * n((L, C, C)),
         1.0 + 0.1 * n((L, C)), 0.08 * n((L, H, C)), 0.08 * n((L, H, C)), 0.05 * n((L, C, H)),
         1.0 + 0.1 * n((C,)), 0.1 * n((V, C))]
    return [a.astype(np.float32).astype(np.float64) for a in p]


def batch(tokens, k, B, T):
    buf = tokens[k * B * T:k * B * T + B * T + 1]
    return buf[:-1].reshape(B, T), buf[1:].reshape(B, T)


# ---- the model ---------------------------------------------------------------------------

def rope_freqs(cfg, T):
    """complex128 (T, HS/2): exp(i t f_j), f_j = theta^(-2j/HS), Llama 3.1-scaled if asked."""
    hs = cfg.HS
    f = [1.0 / cfg.theta ** (2.0 * j / hs) for j in range(hs // 2)]
    if cfg.scaled:
        fac, lo, hi, orig = [float(np.float32(r)) for r in cfg.rope]
        g = []
        for x in f:
            wl = 2 * math.pi / x
            if wl < orig / hi:
                g.append(x)
            elif wl > orig / lo:
                g.append(x / fac)
            else:
                s = (orig / wl - lo) / (hi - lo)
                g.append((1 - s) * x / fac + s * x)
        f = g
    ang = torch.outer(torch.arange(T, dtype=torch.float64), torch.tensor(f, dtype=torch.float64))
    return torch.polar(torch.ones_like(ang), ang)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate(x, fc):
    """x (B, T, heads, HS): pairs (x[2j], x[2j+1]) as complex numbers times fc (T, HS/2)."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * fc[None, :, None, :]).flatten(3)


def forward_loss(cfg, P, inp, tgt):
    wte, an, qkvw, apw, mn, fcw, fc2w, fpw, nf, head = P
    if cfg.tied:
        head = wte   # Llama 3.2's tie_word_embeddings: the head reads the embedding
    B, T = inp.shape
    NH, NKV, hs, C = cfg.NH, cfg.NKV, cfg.HS, cfg.C
    fc = rope_freqs(cfg, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = wte[inp]
    for l in range(cfg.L):
        h = rmsnorm(x, an[l], cfg.eps)
        qkv = h @ qkvw[l].t()
        q, k, v = qkv.split([NH * hs, NKV * hs, NKV * hs], dim=-1)
        q = rotate(q.reshape(B, T, NH, hs), fc)
        k = rotate(k.reshape(B, T, NKV, hs), fc)
        v = v.reshape(B, T, NKV, hs)
        rep = NH // NKV   # query head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        y = (a @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ apw[l].t()
        h = rmsnorm(x, mn[l], cfg.eps)
        up, gate = h @ fcw[l].t(), h @ fc2w[l].t()
        x = x + (up * torch.nn.functional.silu(gate)) @ fpw[l].t()
    logits = rmsnorm(x, nf, cfg.eps) @ head.t()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.V), tgt.reshape(-1))


# ---- the same model as Hugging Face writes and runs it ----------------------------------

def hf_tensors(cfg, params):
    """LlamaForCausalLM's tensors: q_proj and k_proj permuted for rotate-half RoPE (as
    convert_llama_weights_to_hf.py does), no lm_head when tied."""
    wte, an, qkv, ap, mn, fc, fc2, fp, nf, lm = params
    Q, K = cfg.NH * cfg.HS, cfg.NKV * cfg.HS
    t = [("model.embed_tokens.weight", wte)]
    for l in range(cfg.L):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", an[l]),
              (p + "self_attn.q_proj.weight", st_write.permute_rotate_half(qkv[l][:Q], cfg.NH)),
              (p + "self_attn.k_proj.weight", st_write.permute_rotate_half(qkv[l][Q:Q + K], cfg.NKV)),
              (p + "self_attn.v_proj.weight", qkv[l][Q + K:]),
              (p + "self_attn.o_proj.weight", ap[l]),
              (p + "post_attention_layernorm.weight", mn[l]),
              (p + "mlp.gate_proj.weight", fc2[l]), (p + "mlp.up_proj.weight", fc[l]),
              (p + "mlp.down_proj.weight", fp[l])]
    t.append(("model.norm.weight", nf))
    if not cfg.tied:
        t.append(("lm_head.weight", lm))
    return t


def hf_config(cfg):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.V,
         "hidden_size": cfg.C, "intermediate_size": cfg.H, "num_hidden_layers": cfg.L,
         "num_attention_heads": cfg.NH, "num_key_value_heads": cfg.NKV, "head_dim": cfg.HS,
         "max_position_embeddings": cfg.maxT, "rms_norm_eps": cfg.eps, "rope_theta": cfg.theta,
         "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
         "tie_word_embeddings": bool(cfg.tied), "torch_dtype": "float32", "rope_scaling": None}
    if cfg.scaled:
        c["rope_scaling"] = {"rope_type": "llama3", "factor": cfg.rope[0], "low_freq_factor": cfg.rope[1],
                             "high_freq_factor": cfg.rope[2], "original_max_position_embeddings": cfg.rope[3]}
    return c


def forward_loss_hf(cfg, W, inp, tgt):
    """Hugging Face's LlamaForCausalLM forward on its own tensors (rotate-half RoPE)."""
    B, T = inp.shape
    NH, NKV, hs, C = cfg.NH, cfg.NKV, cfg.HS, cfg.C
    fc = rope_freqs(cfg, T)
    ang = torch.cat([torch.angle(fc), torch.angle(fc)], dim=-1)   # (T, hs): freqs repeated, as HF does
    cos, sin = torch.cos(ang)[None, None], torch.sin(ang)[None, None]

    def rot_half(x):
        return torch.cat([-x[..., hs // 2:], x[..., :hs // 2]], dim=-1)

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = W["model.embed_tokens.weight"][inp]
    for l in range(cfg.L):
        g = lambda n: W["model.layers.%d.%s" % (l, n)]
        h = rmsnorm(x, g("input_layernorm.weight"), cfg.eps)
        q = (h @ g("self_attn.q_proj.weight").t()).reshape(B, T, NH, hs).transpose(1, 2)
        k = (h @ g("self_attn.k_proj.weight").t()).reshape(B, T, NKV, hs).transpose(1, 2)
        v = (h @ g("self_attn.v_proj.weight").t()).reshape(B, T, NKV, hs).transpose(1, 2)
        q, k = q * cos + rot_half(q) * sin, k * cos + rot_half(k) * sin
        k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
        a = torch.softmax(((q @ k.transpose(-1, -2)) / math.sqrt(hs)).masked_fill(~mask, float("-inf")), dim=-1)
        x = x + (a @ v).transpose(1, 2).reshape(B, T, C) @ g("self_attn.o_proj.weight").t()
        h = rmsnorm(x, g("post_attention_layernorm.weight"), cfg.eps)
        x = x + (torch.nn.functional.silu(h @ g("mlp.gate_proj.weight").t()) * (h @ g("mlp.up_proj.weight").t())) \
            @ g("mlp.down_proj.weight").t()
    head = W["model.embed_tokens.weight"] if cfg.tied else W["lm_head.weight"]
    logits = rmsnorm(x, W["model.norm.weight"], cfg.eps) @ head.t()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.V), tgt.reshape(-1))


def loss_and_grads(cfg, params, inp, tgt):
    P = [torch.tensor(p, requires_grad=True) for p in params]
    loss = forward_loss(cfg, P, torch.as_tensor(inp), torch.as_tensor(tgt))
    loss.backward()
    g = [p.grad.numpy().copy() if p.grad is not None else None for p in P]
    if cfg.tied:
        g[9] = g[0].copy()   # lm_head's slot holds wte (its gradient, the sum of both uses)
    return float(loss), g


def reference_train(cfg, params, tokens, B, T, steps, hp):
    params = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses, g1 = [], None
    for s in range(steps):
        inp, tgt = batch(tokens, s, B, T)
        loss, g = loss_and_grads(cfg, params, inp, tgt)
        losses.append(loss)
        g1 = g if s == 0 else g1
        t = s + 1
        for i, name in enumerate(NAMES):
            m[i] = hp["b1"] * m[i] + (1 - hp["b1"]) * g[i]
            v[i] = hp["b2"] * v[i] + (1 - hp["b2"]) * g[i] ** 2
            upd = (m[i] / (1 - hp["b1"] ** t)) / (np.sqrt(v[i] / (1 - hp["b2"] ** t)) + hp["eps"])
            if name in DECAY:
                upd = upd + hp["wd"] * params[i]
            params[i] = params[i] - hp["lr"] * upd
    return losses, g1


def finite_difference_check(cfg, params, inp, tgt, grads, rng):
    """Central differences on a few elements of every tensor; returns the worst error
    relative to the tensor's largest gradient."""
    worst = 0.0
    h = 1e-6
    ti, tt = torch.as_tensor(inp), torch.as_tensor(tgt)
    for i, g in enumerate(grads):
        if cfg.tied and i == 9:
            continue   # lm_head's slot is wte: checked through i = 0
        scale = max(float(np.max(np.abs(g))), 1e-30)
        for fi in list(rng.choice(g.size, size=3, replace=False)) + [int(np.argmax(np.abs(g)))]:
            idx = np.unravel_index(fi, g.shape)
            vals = []
            for d in (h, -h):
                P = [p.copy() for p in params]
                P[i][idx] += d
                with torch.no_grad():
                    vals.append(float(forward_loss(cfg, [torch.tensor(p) for p in P], ti, tt)))
            worst = max(worst, abs((vals[0] - vals[1]) / (2 * h) - g[idx]) / scale)
    return worst


# ---- the comparison ----------------------------------------------------------------------

def default_config():
    # NH 6 / NKV 2 (3 query heads per kv head), HS = 10; H = 208 from ffn_mult 1.3 and
    # multiple_of 16; theta 20000 puts one frequency in the smooth band of the 3.1 scaling
    return Config(V=97, C=60, L=2, NH=6, NKV=2, maxT=16, multiple_of=16, ffn_mult=1.3, eps=1e-5,
                  theta=20000.0, scaled=True)


def long_config():
    # positions up to 2047 with HS = 6 and theta 500000: one frequency in each band of the 3.1
    # scaling (kept, blended, divided by 8), so the scaling shows in the loss
    return Config(V=64, C=12, L=1, NH=2, NKV=1, maxT=2048, multiple_of=8, ffn_mult=0, eps=1e-5,
                  theta=500000.0, scaled=True)


def tied_config():
    # Llama 3.2's conventions: a tied head and rope_scaling factor 32 (low 1, high 4, original
    # 512 here, so T = 40 positions reach every band with theta 10000 and HS 8)
    return Config(V=53, C=24, L=2, NH=3, NKV=1, maxT=64, multiple_of=8, ffn_mult=0, eps=1e-5,
                  theta=10000.0, scaled=True, tied=True, rope=(32.0, 1.0, 4.0, 512))


def run(args):
    if args.only_hf:
        args.hf = True
        rc = rc2 = rc3 = 0
    else:
        rc = run_case(args, "odd shapes", default_config(), 3, 7, 5, True)
        rc2 = run_case(args, "long context", long_config(), 1, 2048, 2, args.self_check == "all")
        rc3 = run_case(args, "tied head, rope factor 32", tied_config(), 2, 40, 5, True)
    rc4 = rc5 = 0
    if args.hf:
        rc4 = run_case(args, "odd shapes, Hugging Face F32, sharded", default_config(), 3, 7, 5, False,
                       {"dtype": "F32", "shard": 40000})
        rc5 = run_case(args, "tied head, Hugging Face BF16", tied_config(), 2, 40, 5, False, {"dtype": "BF16"})
    return rc or rc2 or rc3 or rc4 or rc5


def run_case(args, label, cfg, B, T, S, self_check, hf=None):
    print("\n=== %s ===" % label)
    hp = dict(lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, wd=0.1)
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="torch_llama.")
    os.makedirs(work, exist_ok=True)
    try:
        params = random_model(cfg, 4321)
        if cfg.tied:
            params[9] = params[0].copy()   # the file's lm_head slot holds wte
        rng = np.random.RandomState(99)
        tokens = rng.randint(0, cfg.V, size=S * B * T + 1 + 50).astype(np.int64)
        model, data = os.path.join(work, "model.bin"), os.path.join(work, "tokens.bin")
        metrics, gpath = os.path.join(work, "m.jsonl"), os.path.join(work, "grads.bin")
        fails = []
        if hf:   # the same model as a Hugging Face directory, its values as the dtype holds them
            params = [st_write.round_to(p, hf["dtype"]) for p in params]
            model = os.path.join(work, "hf")
            st_write.write_model_dir(model, hf_config(cfg), hf_tensors(cfg, params), hf["dtype"], hf.get("shard", 0))
            i0, t0 = batch(tokens, 0, B, T)
            W = {n: torch.tensor(a) for n, a in hf_tensors(cfg, params)}
            with torch.no_grad():
                lh = float(forward_loss_hf(cfg, W, torch.as_tensor(i0), torch.as_tensor(t0)))
                li = float(forward_loss(cfg, [torch.tensor(p) for p in params], torch.as_tensor(i0),
                                        torch.as_tensor(t0)))
            print("Hugging Face files (%s%s); its rotate-half forward on them: loss %.12f, the interleaved "
                  "reference %.12f" % (hf["dtype"], ", sharded" if hf.get("shard") else "", lh, li))
            if abs(lh - li) > 1e-10 * abs(li):
                fails.append("the rotate-half forward on the permuted tensors differs from the interleaved one")
        else:
            write_model(model, cfg, params)
        write_tokens(data, tokens)
        print("model: V=%d C=%d L=%d NH=%d NKV=%d HS=%d H=%d theta=%g scaled=%d; B=%d T=%d steps=%d"
              % (cfg.V, cfg.C, cfg.L, cfg.NH, cfg.NKV, cfg.HS, cfg.H, cfg.theta, cfg.scaled, B, T, S))
        inp, tgt = batch(tokens, 0, B, T)
        if self_check:
            _, g0 = loss_and_grads(cfg, params, inp, tgt)
            fd = finite_difference_check(cfg, params, inp, tgt, g0, np.random.RandomState(5))
            print("reference self-check: autograd vs central differences, worst %.2e" % fd)
            if fd > 1e-6:
                fails.append("the torch reference disagrees with finite differences (%.2e)" % fd)
        else:
            print("reference self-check: not on this case (--self-check first)")
        cmd = (["timeout", str(args.timeout)] if args.timeout > 0 else []) + [
            args.pipelm, "train", "--init", model, "--data", data, "--batch", str(B), "--seq-len", str(T),
            "--steps", str(S), "--microbatches", "1", "--lr", repr(hp["lr"]), "--lr-schedule", "constant",
            "--warmup-steps", "0", "--weight-decay", repr(hp["wd"]), "--grad-clip", "0", "--beta1", "0.9",
            "--beta2", "0.95", "--eps", "1e-8", "--eval-every", "0", "--progress", "0",
            "--metrics", metrics, "--dump-grads", gpath] + args.extra
        if cfg.tied and not hf:   # settings an llm.c header does not hold
            cmd += ["--tie-embeddings", "1", "--rope-scaling-factor", repr(cfg.rope[0]), "--rope-low-freq-factor",
                    repr(cfg.rope[1]), "--rope-high-freq-factor", repr(cfg.rope[2]), "--rope-original-max-pos",
                    str(cfg.rope[3])]
        print("running: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        r = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = r.stdout.decode("utf-8", "replace")
        if r.returncode != 0:
            print(out[-3000:])
            print("FAIL: pipelm exited with %d" % r.returncode)
            return 1
        ref_losses, ref_grads = reference_train(cfg, params, tokens, B, T, S, hp)
        got = {}
        for line in open(metrics):
            d = json.loads(line)
            if d.get("event") == "step":
                got.setdefault(int(d["step"]), float(d["loss"]))
        print("\nlosses (relative error <= %g)" % args.loss_tol)
        for s in range(1, S + 1):
            ref = ref_losses[s - 1]
            if s not in got:
                fails.append("no loss for step %d" % s)
                continue
            e = abs(got[s] - ref) / abs(ref)
            print("  %d  pipelm %.10f  torch %.10f  rel.err %.2e  %s" % (s, got[s], ref, e,
                                                                     "ok" if e <= args.loss_tol else "FAIL"))
            if e > args.loss_tol:
                fails.append("step %d loss rel.err %.2e" % (s, e))
        print("\nstep-1 gradients (max|a-b| / max|b| <= %g)" % args.grad_tol)
        try:
            pg = read_model(gpath, cfg, hf is not None)
        except ValueError as e:
            fails.append("gradient file: %s" % e)
            pg = []
        for name, a, b in zip(NAMES, pg, ref_grads):
            e = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)
            ok = np.all(np.isfinite(a)) and e <= args.grad_tol
            print("  %-9s %-12s max|torch| %.3e  rel.err %.2e  %s" % (name, "x".join(map(str, a.shape)),
                                                                   np.max(np.abs(b)), e, "ok" if ok else "FAIL"))
            if not ok:
                fails.append("gradient %s rel.err %.2e" % (name, e))
        if fails:
            print("\nFAIL:\n  - " + "\n  - ".join(fails))
            return 1
        print("\nPASS: pipelm's Llama matches the torch reference (%d losses, %d gradient tensors)"
              % (S, len(NAMES)))
        return 0
    finally:
        if args.keep:
            os.makedirs(os.path.join(work, label.replace(" ", "_")), exist_ok=True)
            for f in ("model.bin", "tokens.bin", "m.jsonl", "grads.bin"):
                if os.path.exists(os.path.join(work, f)):
                    os.replace(os.path.join(work, f), os.path.join(work, label.replace(" ", "_"), f))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelm")
    ap.add_argument("--keep")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--grad-tol", type=float, default=1e-3)
    ap.add_argument("--write-model", metavar="OUT", help="write the test model as an llm.c Llama file and exit")
    ap.add_argument("--version", type=int, default=3, choices=(3, 5))
    ap.add_argument("--check-bf16", metavar="FILE", help="exit 0 iff FILE (an fp32 llm.c Llama file) holds the "
                    "test model rounded to bf16, bit for bit")
    ap.add_argument("--self-check", choices=("all", "first"), default="all",
                    help="check the reference's gradients against finite differences on every case (all), or "
                    "on the odd-shapes case only (first): the long-context case runs the same code at T = 2048, "
                    "where the check is nine tenths of the script's time")
    ap.add_argument("--hf", action="store_true", help="also run two cases from Hugging Face files (F32 sharded, "
                    "a tied head in BF16)")
    ap.add_argument("--only-hf", action="store_true", help="run the two Hugging Face cases only")
    ap.add_argument("--write-hf", metavar="DIR", help="write the test model as a Hugging Face directory and exit")
    ap.add_argument("--hf-dtype", choices=st_write.DTYPES, default="F32")
    ap.add_argument("--tied", action="store_true", help="with --write-hf: the tied-head test model")
    ap.add_argument("extra", nargs="*", help="more pipelm train options (after --)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.write_model:
        cfg = default_config()
        write_model(args.write_model, cfg, random_model(cfg, 4321), args.version)
        return 0
    if args.write_hf:
        cfg = tied_config() if args.tied else default_config()
        params = [st_write.round_to(p, args.hf_dtype) for p in random_model(cfg, 4321)]
        st_write.write_model_dir(args.write_hf, hf_config(cfg), hf_tensors(cfg, params), args.hf_dtype)
        return 0
    if args.check_bf16:
        cfg = default_config()
        got = read_model(args.check_bf16, cfg)
        want = [(to_bf16_bits(p).astype(np.uint32) << 16).view("<f4").astype(np.float64)
                for p in random_model(cfg, 4321)]
        bad = [n for n, a, b in zip(NAMES, got, want) if not np.array_equal(a, b)]
        print("bf16 read: %s" % ("differs in " + ", ".join(bad) if bad else "every tensor exact"))
        return 1 if bad else 0
    if not args.pipelm:
        ap.error("--pipelm is required")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
