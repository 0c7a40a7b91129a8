#!/usr/bin/python3
"""Independent PyTorch reference for pipelm's Mixtral (a sparse mixture-of-experts Llama).

Written from the documented semantics of Mixtral (Jiang et al. 2024, "Mixtral of Experts") and
Hugging Face's MixtralForCausalLM / MixtralSparseMoeBlock, with DeepSeek-V3's shared experts
and auxiliary-loss-free sigmoid router as variants, not from pipelm's code:

  attention   Llama 3's: RMSNorm, a fused q|k|v projection, rotary embeddings on interleaved
              pairs, grouped-query causal attention, o_proj; residual
  router      logits = h gate^T (E); softmax over the E experts (the sigmoid variant: sigmoid
              scores, and a per-expert bias added for the choice only); the top K (ties: the
              lower expert); their scores renormalised to sum to 1
  experts     expert e: w2 (silu(w1 h) * w3 h); a token's output the weighted sum of its K
              experts; shared experts (S of hidden F, one SwiGLU of hidden S F) always added
  capacity    with a capacity factor c an expert keeps ceil(c N K / E) of a micro-batch's N
              tokens, dropping its lowest router weights first (ties: the later token)
  aux loss    per layer E sum_e (n_e / N) P_e (n_e the tokens whose top K hold e, P_e the mean
              routing probability; the sigmoid scores normalised per token); a micro-batch's
              is the mean over the layers (Hugging Face's load_balancing_loss_func for one layer)
  objective   per micro-batch: mean cross-entropy + coef aux; the step: their mean
  bias        after each step b -= rate sign(load_e - N K / E), the loads over the whole step

It writes the model as pipelm's Mixtral file (llm.c's layout, magic 20261206) and llm.c
tokens, runs `pipelm train --init model.bin ... --metrics m.jsonl --dump-grads g.bin`, and
compares pipelm's losses of 5 AdamW steps (relative 1e-5) and every step-1 gradient tensor
(within 1e-5 of its largest magnitude) with this float64 computation. The reference's own
gradients are first checked against central differences.

    torch_moe.py --pipelm PATH [--keep DIR] [--timeout SEC] [--case NAME ...]

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

MODEL_MAGIC = 20261206
TOKEN_MAGIC = 20240801
LOAD_SCALE = 2.0 ** -40   # pipelm carries the load error in the bias's gradient slot at this scale


class Config:
    def __init__(self, V, C, L, NH, NKV, maxT, E, K, F, S=0, router=0, aux=0.02, rate=0.0, cap=0.0,
                 eps=1e-5, theta=10000.0):
        assert C % NH == 0 and NH % NKV == 0 and (C // NH) % 2 == 0 and 1 <= K <= E
        self.V, self.C, self.L, self.NH, self.NKV, self.maxT = V, C, L, NH, NKV, maxT
        self.E, self.K, self.F, self.S, self.router = E, K, F, S, router
        f32 = lambda x: float(np.float32(x))   # the header holds float32
        self.aux, self.rate, self.cap = f32(aux), f32(rate), f32(cap)
        self.eps, self.theta = f32(eps), f32(theta)
        self.HS = C // NH
        self.QKV = (NH + 2 * NKV) * self.HS

    def shapes(self):
        """name, shape (per layer for block tensors), per-layer, decayed (2-D) — file order."""
        V, C, E, F, SF, Q = self.V, self.C, self.E, self.F, self.S * self.F, self.QKV
        return [("wte", (V, C), 0, 1), ("lm_head", (V, C), 0, 1), ("attn_norm", (C,), 1, 0),
                ("qkv", (Q, C), 1, 1), ("attproj", (C, C), 1, 1), ("mlp_norm", (C,), 1, 0),
                ("router", (E, C), 1, 1), ("w1", (E * F, C), 1, 1), ("w3", (E * F, C), 1, 1),
                ("w2", (E * C, F), 1, 1), ("bias", (E,), 1, 0), ("sw1", (SF, C), 1, 1),
                ("sw3", (SF, C), 1, 1), ("sw2", (C, SF), 1, 1), ("norm_f", (C,), 0, 0)]

    def header(self):
        hi = np.zeros(256, dtype="<i4")
        hf = np.zeros(256, dtype="<f4")
        hi[:13] = [MODEL_MAGIC, 3, self.maxT, self.V, self.L, self.NH, self.NKV, self.C, self.E, self.K, self.F,
                   self.S, self.router]
        hf[:5] = [self.eps, self.theta, self.aux, self.rate, self.cap]
        return hi, hf


def full_shape(cfg, shape, per_layer):
    return (cfg.L,) + tuple(shape) if per_layer else tuple(shape)


def write_model(path, cfg, params):
    hi, hf = cfg.header()
    with open(path, "wb") as f:
        hi.tofile(f)
        hf.tofile(f)
        for (name, shape, per, _), p in zip(cfg.shapes(), params):
            assert p.shape == full_shape(cfg, shape, per), name
            np.ascontiguousarray(p, dtype="<f4").tofile(f)


def read_model(path, cfg):
    raw = open(path, "rb").read()
    hi = np.frombuffer(raw[:1024], dtype="<i4")
    hf = np.frombuffer(raw[1024:2048], dtype="<f4")
    wi, wf = cfg.header()
    if not np.array_equal(hi, wi) or not np.array_equal(hf, wf):
        raise ValueError("%s: header differs from the model's" % path)
    flat = np.frombuffer(raw[2048:], dtype="<f4").astype(np.float64)
    out, off = [], 0
    for name, shape, per, _ in cfg.shapes():
        s = full_shape(cfg, shape, per)
        k = int(np.prod(s))
        out.append(flat[off:off + k].reshape(s))
        off += k
    if off != flat.size:
        raise ValueError("%s: %d floats after the header, expected %d" % (path, flat.size, off))
    return out


def write_tokens(path, tokens):
    h = np.zeros(256, dtype="<i4")
    h[:3] = [TOKEN_MAGIC, 7, len(tokens)]
    with open(path, "wb") as f:
        h.tofile(f)
        np.asarray(tokens, dtype="<u4").tofile(f)


def random_model(cfg, seed):
    rng = np.random.RandomState(seed)
    scale = {"wte": 0.1, "lm_head": 0.1, "qkv": 0.15, "attproj": 0.06, "router": 0.3, "w1": 0.1, "w3": 0.1,
             "w2": 0.06, "sw1": 0.1, "sw3": 0.1, "sw2": 0.06, "bias": 0.05}
    out = []
    for name, shape, per, _ in cfg.shapes():
        s = full_shape(cfg, shape, per)
        if name in ("attn_norm", "mlp_norm", "norm_f"):
            a = 1.0 + 0.1 * rng.standard_normal(s)
        elif name == "bias" and cfg.router == 0:
            a = np.zeros(s)   # unused by the softmax router: pipelm keeps it zero
        else:
            a = scale[name] * rng.standard_normal(s)
        out.append(a.astype(np.float32).astype(np.float64))
    return out


def batch(tokens, k, B, T):
    buf = tokens[k * B * T:k * B * T + B * T + 1]
    return buf[:-1].reshape(B, T), buf[1:].reshape(B, T)


# ---- the model ---------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(cfg, x, T):
    """x (B, T, H, HS): rotate interleaved pairs (x[2i], x[2i+1]) at position t by t theta^(-2i/HS)."""
    half = cfg.HS // 2
    inv = 1.0 / (cfg.theta ** (torch.arange(half, dtype=torch.float64) * 2 / cfg.HS))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]          # (T, half)
    c, s = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def attention(cfg, x, P, l):
    B, T, C = x.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    h = rmsnorm(x, P["attn_norm"][l], cfg.eps)
    qkv = h @ P["qkv"][l].T
    q = qkv[..., :NH * HS].reshape(B, T, NH, HS)
    k = qkv[..., NH * HS:(NH + NKV) * HS].reshape(B, T, NKV, HS)
    v = qkv[..., (NH + NKV) * HS:].reshape(B, T, NKV, HS)
    q, k = rope(cfg, q, T), rope(cfg, k, T)
    rep = NH // NKV
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HS)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
    return x + y @ P["attproj"][l].T


def swiglu(h, w1, w3, w2):
    return (torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)) @ w2.T


def choose(cfg, score):
    """The K largest of each row (ties: the lower index), sorted ascending; a numpy array."""
    s = score.detach().numpy()
    out = np.zeros((s.shape[0], cfg.K), dtype=np.int64)
    for t in range(s.shape[0]):
        order = sorted(range(cfg.E), key=lambda e: (-s[t, e], e))
        out[t] = sorted(order[:cfg.K])
    return out


def kept(cfg, idx, w):
    """Capacity: a (N, K) mask of the assignments each expert keeps."""
    N = idx.shape[0]
    keep = np.ones(idx.shape, dtype=bool)
    if cfg.cap <= 0:
        return keep
    cap = math.ceil(float(np.float32(cfg.cap)) * N * cfg.K / cfg.E)
    wv = w.detach().numpy().astype(np.float32)   # pipelm compares the float32 weights
    for e in range(cfg.E):
        pairs = [(t, k) for t in range(N) for k in range(cfg.K) if idx[t, k] == e]
        pairs.sort(key=lambda tk: (-wv[tk], tk[0]))
        for t, k in pairs[cap:]:
            keep[t, k] = False
    return keep


def moe(cfg, h, P, l, stats):
    """h (N, C) -> (N, C); returns the layer's aux loss; stats collects loads and drops."""
    N, E, K, F, C = h.shape[0], cfg.E, cfg.K, cfg.F, cfg.C
    z = h @ P["router"][l].T                                   # (N, E)
    if cfg.router == 1:
        p = torch.sigmoid(z)
        idx = choose(cfg, p + P["bias"][l])
        q = p / p.sum(-1, keepdim=True)
    else:
        p = torch.softmax(z, -1)
        idx = choose(cfg, p)
        q = p
    w = p.gather(1, torch.as_tensor(idx))
    w = w / w.sum(-1, keepdim=True)                            # (N, K)
    keep = kept(cfg, idx, w)
    out = torch.zeros_like(h)
    for e in range(E):
        tk = [(t, k) for t in range(N) for k in range(K) if idx[t, k] == e and keep[t, k]]
        if not tk:
            continue
        t = torch.as_tensor([a for a, _ in tk])
        k = torch.as_tensor([b for _, b in tk])
        y = swiglu(h[t], P["w1"][l][e * F:(e + 1) * F], P["w3"][l][e * F:(e + 1) * F], P["w2"][l][e * C:(e + 1) * C])
        out = out.index_add(0, t, w[t, k][:, None] * y)
    if cfg.S:
        out = out + swiglu(h, P["sw1"][l], P["sw3"][l], P["sw2"][l])
    cnt = np.bincount(idx.reshape(-1), minlength=E)
    stats["load"][l] += cnt
    stats["dropped"] += int((~keep).sum())
    return out, E * (torch.as_tensor(cnt / N) * q.mean(0)).sum()


def forward_loss(cfg, P, inp, tgt, stats):
    B, T = inp.shape
    x = P["wte"][inp]
    auxes = []
    for l in range(cfg.L):
        x = attention(cfg, x, P, l)
        h = rmsnorm(x, P["mlp_norm"][l], cfg.eps).reshape(B * T, cfg.C)
        y, aux = moe(cfg, h, P, l, stats)
        x = x + y.reshape(B, T, cfg.C)
        auxes.append(aux)
    logits = rmsnorm(x, P["norm_f"], cfg.eps) @ P["lm_head"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * T, cfg.V), tgt.reshape(-1))
    return ce, torch.stack(auxes).mean()


# ---- Hugging Face's layout: MixtralForCausalLM's tensors and config.json --------------------

def hf_tensors(cfg, params):
    """The Hugging Face names: q_proj and k_proj permuted for rotate-half RoPE (as Hugging
    Face's conversion scripts write them), one w1 / w2 / w3 per expert, the gate."""
    P = dict(zip(names(cfg), params))
    Q, K, F, C = cfg.NH * cfg.HS, cfg.NKV * cfg.HS, cfg.F, cfg.C
    t = [("model.embed_tokens.weight", P["wte"])]
    for l in range(cfg.L):
        p = "model.layers.%d." % l
        qkv = P["qkv"][l]
        t += [(p + "input_layernorm.weight", P["attn_norm"][l]),
              (p + "self_attn.q_proj.weight", st_write.permute_rotate_half(qkv[:Q], cfg.NH)),
              (p + "self_attn.k_proj.weight", st_write.permute_rotate_half(qkv[Q:Q + K], cfg.NKV)),
              (p + "self_attn.v_proj.weight", qkv[Q + K:]),
              (p + "self_attn.o_proj.weight", P["attproj"][l]),
              (p + "post_attention_layernorm.weight", P["mlp_norm"][l]),
              (p + "block_sparse_moe.gate.weight", P["router"][l])]
        for e in range(cfg.E):
            q = p + "block_sparse_moe.experts.%d." % e
            t += [(q + "w1.weight", P["w1"][l][e * F:(e + 1) * F]), (q + "w2.weight", P["w2"][l][e * C:(e + 1) * C]),
                  (q + "w3.weight", P["w3"][l][e * F:(e + 1) * F])]
    t += [("model.norm.weight", P["norm_f"]), ("lm_head.weight", P["lm_head"])]
    return t


def hf_config(cfg):
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": cfg.V,
            "hidden_size": cfg.C, "intermediate_size": cfg.F, "num_hidden_layers": cfg.L,
            "num_attention_heads": cfg.NH, "num_key_value_heads": cfg.NKV, "head_dim": cfg.HS,
            "max_position_embeddings": cfg.maxT, "rms_norm_eps": cfg.eps, "rope_theta": cfg.theta,
            "num_local_experts": cfg.E, "num_experts_per_tok": cfg.K, "router_aux_loss_coef": cfg.aux,
            "router_jitter_noise": 0.0, "sliding_window": None, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": "float32"}


def hf_attention_out(cfg, W, x, l):
    """Hugging Face's attention on its own (permuted) tensors: rotate-half RoPE."""
    B, T, C = x.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    p = "model.layers.%d." % l
    h = rmsnorm(x, W[p + "input_layernorm.weight"], cfg.eps)
    q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(B, T, NH, HS)
    k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(B, T, NKV, HS)
    v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(B, T, NKV, HS)
    inv = 1.0 / (cfg.theta ** (torch.arange(HS // 2, dtype=torch.float64) * 2 / HS))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    c, s = torch.cos(emb)[None, :, None, :], torch.sin(emb)[None, :, None, :]
    rot = lambda z: torch.cat([-z[..., HS // 2:], z[..., :HS // 2]], -1)
    q, k = q * c + rot(q) * s, k * c + rot(k) * s
    k, v = k.repeat_interleave(NH // NKV, dim=2), v.repeat_interleave(NH // NKV, dim=2)
    att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HS)
    att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")).softmax(-1)
    return x + torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C) @ W[p + "self_attn.o_proj.weight"].T


def hf_attention_check(cfg, params, inp):
    """Our interleaved attention on our tensors against Hugging Face's on the permuted ones."""
    W = {n: torch.tensor(a) for n, a in hf_tensors(cfg, params)}
    P = {n: torch.tensor(p) for n, p in zip(names(cfg), params)}
    x = P["wte"][torch.as_tensor(inp)]
    with torch.no_grad():
        a, b = attention(cfg, x, P, 0), hf_attention_out(cfg, W, x, 0)
    return float((a - b).abs().max())


def names(cfg):
    return [n for n, _, _, _ in cfg.shapes()]


def step_loss_and_grads(cfg, params, inp, tgt, M):
    """The step's objective over M micro-batches; its cross-entropy, the gradients, the loads."""
    P = {n: torch.tensor(p, requires_grad=True) for n, p in zip(names(cfg), params)}
    stats = {"load": np.zeros((cfg.L, cfg.E), dtype=np.int64), "dropped": 0}
    Bm = inp.shape[0] // M
    total, ce_sum = 0, 0.0
    for m in range(M):
        i, t = torch.as_tensor(inp[m * Bm:(m + 1) * Bm]), torch.as_tensor(tgt[m * Bm:(m + 1) * Bm])
        ce, aux = forward_loss(cfg, P, i, t, stats)
        total = total + (ce + cfg.aux * aux) / M
        ce_sum += float(ce) / M
        stats["aux"] = stats.get("aux", 0.0) + float(aux) / M
    total.backward()
    g = []
    for n in names(cfg):
        gg = P[n].grad
        g.append(gg.numpy().copy() if gg is not None else np.zeros(P[n].shape))
    N = inp.size
    err = stats["load"] - N * cfg.K / cfg.E                      # (L, E)
    g[names(cfg).index("bias")] = LOAD_SCALE * err if cfg.router == 1 else np.zeros_like(err, dtype=np.float64)
    return ce_sum, g, stats


def reference_train(cfg, params, tokens, B, T, M, steps, hp):
    params = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses, g1, drops = [], None, []
    decay = {n for n, _, _, d in cfg.shapes() if d}
    for s in range(steps):
        inp, tgt = batch(tokens, s, B, T)
        loss, g, st = step_loss_and_grads(cfg, params, inp, tgt, M)
        losses.append(loss)
        drops.append((st["dropped"], st["aux"]))
        g1 = g if s == 0 else g1
        t = s + 1
        for i, name in enumerate(names(cfg)):
            if name == "bias":   # not trained: the sign of the step's load error
                params[i] = params[i] - cfg.rate * np.sign(g[i])
                continue
            m[i] = hp["b1"] * m[i] + (1 - hp["b1"]) * g[i]
            v[i] = hp["b2"] * v[i] + (1 - hp["b2"]) * g[i] ** 2
            upd = (m[i] / (1 - hp["b1"] ** t)) / (np.sqrt(v[i] / (1 - hp["b2"] ** t)) + hp["eps"])
            if name in decay:
                upd = upd + hp["wd"] * params[i]
            params[i] = params[i] - hp["lr"] * upd
    return losses, g1, drops, params


def finite_difference_check(cfg, params, inp, tgt, M, grads, rng):
    """Central differences on a few elements of every trained tensor; the worst error relative
    to the tensor's largest gradient (the routing choices do not change at this step)."""
    worst, h = 0.0, 1e-6

    def objective(ps):
        P = {n: torch.tensor(p) for n, p in zip(names(cfg), ps)}
        stats = {"load": np.zeros((cfg.L, cfg.E), dtype=np.int64), "dropped": 0}
        Bm = inp.shape[0] // M
        tot = 0.0
        with torch.no_grad():
            for mb in range(M):
                ce, aux = forward_loss(cfg, P, torch.as_tensor(inp[mb * Bm:(mb + 1) * Bm]),
                                       torch.as_tensor(tgt[mb * Bm:(mb + 1) * Bm]), stats)
                tot += (float(ce) + cfg.aux * float(aux)) / M
        return tot

    for i, name in enumerate(names(cfg)):
        if name == "bias" or params[i].size == 0:
            continue
        big = max(float(np.max(np.abs(grads[i]))), 1e-30)
        for _ in range(3):
            j = tuple(rng.randint(0, d) for d in params[i].shape)
            pp = [p.copy() for p in params]
            pp[i][j] += h
            up = objective(pp)
            pp[i][j] -= 2 * h
            dn = objective(pp)
            worst = max(worst, abs((up - dn) / (2 * h) - grads[i][j]) / big)
    return worst


CASES = {
    # E = 5, top-2, odd shapes (V 61 padded to 128, HS 6, T 7), softmax router, aux on, 2 micro-batches
    "softmax": dict(cfg=dict(V=61, C=36, L=2, NH=6, NKV=2, maxT=16, E=5, K=2, F=20), B=4, T=7, M=2),
    # a shared expert and the sigmoid-bias router (random initial bias, rate 0.01), top-2 of 5
    "shared-sigmoid": dict(cfg=dict(V=61, C=36, L=2, NH=6, NKV=3, maxT=16, E=5, K=2, F=20, S=1, router=1,
                                    rate=0.01, aux=0.05), B=4, T=7, M=2),
    # every token chooses expert 0 (a balancing bias of 10 on it, top-1): the others receive none
    "skewed": dict(cfg=dict(V=61, C=36, L=2, NH=6, NKV=2, maxT=16, E=5, K=1, F=20, router=1, rate=0.01),
                   B=4, T=7, M=1, bias0=10.0),
    # the softmax case read from Hugging Face Mixtral files (one tensor per expert, sharded)
    "hf": dict(cfg=dict(V=61, C=36, L=2, NH=6, NKV=2, maxT=16, E=5, K=2, F=20, rate=0.001), B=4, T=7, M=2, hf=True),
    # capacity factor 1: every expert keeps ceil(N K / E) tokens, the drops deterministic
    "capacity": dict(cfg=dict(V=61, C=36, L=2, NH=6, NKV=2, maxT=16, E=5, K=2, F=20, cap=1.0), B=4, T=7, M=1),
}


def run_case(args, label, case, steps=5):
    print("\n=== %s ===" % label)
    cfg = Config(**case["cfg"])
    B, T, M = case["B"], case["T"], case["M"]
    hp = dict(lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, wd=0.1)
    work = tempfile.mkdtemp(prefix="torch_moe.")
    try:
        params = random_model(cfg, 4321)
        if "bias0" in case:
            params[names(cfg).index("bias")][:, 0] = case["bias0"]
        tokens = np.random.RandomState(99).randint(0, cfg.V, size=steps * B * T + 1 + 50).astype(np.int64)
        model, data = os.path.join(work, "model.bin"), os.path.join(work, "tokens.bin")
        metrics, gpath = os.path.join(work, "m.jsonl"), os.path.join(work, "grads.bin")
        final = os.path.join(work, "final.bin")
        fails = []
        if case.get("hf"):   # the same model as Hugging Face Mixtral files, through the independent writer
            model = os.path.join(work, "hf")
            st_write.write_model_dir(model, hf_config(cfg), hf_tensors(cfg, params), "F32", 200000)
            d = hf_attention_check(cfg, params, batch(tokens, 0, B, T)[0])
            print("Hugging Face files (F32, sharded); rotate-half attention on them against ours: max diff %.2e" % d)
            if d > 1e-12:
                fails.append("the permuted q/k with rotate-half RoPE differ from the interleaved attention (%.2e)" % d)
        else:
            write_model(model, cfg, params)
        write_tokens(data, tokens)
        inp, tgt = batch(tokens, 0, B, T)
        _, g0, _ = step_loss_and_grads(cfg, params, inp, tgt, M)
        fd = finite_difference_check(cfg, params, inp, tgt, M, g0, np.random.RandomState(5))
        print("reference self-check: autograd vs central differences, worst %.2e" % fd)
        if fd > 1e-6:
            fails.append("the torch reference disagrees with finite differences (%.2e)" % fd)
        cmd = (["timeout", str(args.timeout)] if args.timeout > 0 else []) + [
            args.pipelm, "train", "--init", model, "--data", data, "--batch", str(B), "--seq-len", str(T),
            "--steps", str(steps), "--microbatches", str(M), "--lr", repr(hp["lr"]), "--lr-schedule", "constant",
            "--warmup-steps", "0", "--weight-decay", repr(hp["wd"]), "--grad-clip", "0", "--beta1", "0.9",
            "--beta2", "0.95", "--eps", "1e-8", "--eval-every", "0", "--progress", "0",
            "--metrics", metrics, "--dump-grads", gpath, "--save-final", final] + args.extra
        print("running: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        r = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            print(r.stdout.decode("utf-8", "replace")[-3000:])
            print("FAIL: pipelm exited with %d" % r.returncode)
            return 1
        ref_losses, ref_grads, drops, ref_final = reference_train(cfg, params, tokens, B, T, M, steps, hp)
        got, moe = {}, {}
        for line in open(metrics):
            d = json.loads(line)
            if d.get("event") == "step":
                got.setdefault(int(d["step"]), float(d["loss"]))
            if d.get("event") == "moe":
                moe.setdefault(int(d["step"]), (int(d["dropped"]), float(d["aux_loss"])))
        print("aux loss and dropped assignments per step (aux relative error <= %g, drops exact)" % args.loss_tol)
        for s in range(1, steps + 1):
            (rd, ra), (pd, pa) = drops[s - 1], moe.get(s, (-1, float("nan")))
            e = abs(pa - ra) / abs(ra)
            ok = e <= args.loss_tol and pd == rd
            print("  %d  pipelm aux %.10f dropped %d  torch aux %.10f dropped %d  %s" % (s, pa, pd, ra, rd,
                                                                                     "ok" if ok else "FAIL"))
            if not ok:
                fails.append("step %d: aux loss %.10g / dropped %d against %.10g / %d" % (s, pa, pd, ra, rd))
        drops = [d for d, _ in drops]
        print("losses (relative error <= %g)" % args.loss_tol)
        for s in range(1, steps + 1):
            ref = ref_losses[s - 1]
            if s not in got:
                fails.append("no loss for step %d" % s)
                continue
            e = abs(got[s] - ref) / abs(ref)
            print("  %d  pipelm %.10f  torch %.10f  rel.err %.2e  %s" % (s, got[s], ref, e,
                                                                     "ok" if e <= args.loss_tol else "FAIL"))
            if e > args.loss_tol:
                fails.append("step %d loss rel.err %.2e" % (s, e))
        if "bias0" in case and np.any(g0[names(cfg).index("bias")][:, 1:] != LOAD_SCALE * (0 - inp.size * cfg.K / cfg.E)):
            fails.append("the skewed case did not send every token to expert 0")
        if cfg.cap > 0 and sum(drops) == 0:
            fails.append("the capacity case dropped nothing: it tests nothing")
        print("step-1 gradients (max|a-b| / max|b| <= %g)" % args.grad_tol)
        try:
            pg = read_model(gpath, cfg)
        except ValueError as e:
            fails.append("gradient file: %s" % e)
            pg = []
        for name, a, b in zip(names(cfg), pg, ref_grads):
            if a.size == 0:
                continue
            big = float(np.max(np.abs(b)))
            e = float(np.max(np.abs(a - b))) / big if big > 0 else float(np.max(np.abs(a)))
            ok = np.all(np.isfinite(a)) and e <= args.grad_tol
            print("  %-9s %-12s max|torch| %.3e  rel.err %.2e  %s" % (name, "x".join(map(str, a.shape)), big, e,
                                                                   "ok" if ok else "FAIL"))
            if not ok:
                fails.append("gradient %s rel.err %.2e" % (name, e))
        print("the balancing bias after %d steps (AdamW's tensors are judged by the losses: its normalised "
              "steps magnify float noise in near-zero gradients)" % steps)
        try:
            pf = read_model(final, cfg)
        except ValueError as e:
            fails.append("final model file: %s" % e)
            pf = []
        for name, a, b in zip(names(cfg), pf, ref_final):
            if name != "bias":
                continue
            b32 = b.astype(np.float32).astype(np.float64)
            e = float(np.max(np.abs(a - b32))) / max(float(np.max(np.abs(b32))), 1e-30)
            ok = e <= 1e-6
            print("  %-9s max|torch| %.3e  rel.err %.2e  %s" % (name, np.max(np.abs(b32)), e, "ok" if ok else "FAIL"))
            if not ok:
                fails.append("final %s rel.err %.2e" % (name, e))
        if fails:
            print("FAIL:\n  - " + "\n  - ".join(fails))
            return 1
        print("PASS: %s (%d losses, %d gradient tensors)" % (label, steps, len(pg)))
        return 0
    finally:
        if args.keep:
            dst = os.path.join(args.keep, label)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(work, dst)
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipelm", required=True)
    ap.add_argument("--keep")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--loss-tol", type=float, default=1e-5)
    ap.add_argument("--grad-tol", type=float, default=1e-5)
    ap.add_argument("extra", nargs="*", help="more pipelm train options (after --)")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    rc = 0
    for name in args.case or sorted(CASES):
        rc |= run_case(args, name, CASES[name])
    print("\nPASS: pipelm's Mixtral matches the torch reference" if rc == 0 else "\nFAIL")
    return rc


if __name__ == "__main__":
    sys.exit(main())
