#!/usr/bin/python3
"""Independent PyTorch reference for pipelm (GPT-2 as defined by llm.c).

Normal mode: build a small random GPT-2 (odd sizes, padded vocab), write it as
an llm.c model file plus an llm.c token file, run

    pipelm train --init model.bin --data tokens.bin ... --metrics m.jsonl
                 --dump-grads grads.bin

and compare pipelm's per-step losses and step-1 gradients with a float64
PyTorch computation of the same thing (same weights, same batches, AdamW).

    torch_ref.py --pipelm PATH [--keep DIR] [--timeout SEC] [--launcher CMD]

--selftest checks the reference itself, without pipelm:
  * the vectorised torch forward against a plain per-position loop version,
  * autograd gradients of every tensor against float64 central differences,
  * the hand-written AdamW against torch.optim.AdamW (two param groups),
  * the whole comparison pipeline against a stand-in "pipelm" implemented by
    this script in float32 (--as-fake-pipelm), which exercises the file
    formats, the metrics parsing and the tolerances.

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
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_write  # noqa: E402  (the independent safetensors writer)

MODEL_MAGIC = 20240326
TOKEN_MAGIC = 20240520
HEADER_INTS = 256

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# tensors that get decoupled weight decay (the matrices)
DECAY = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


# ----------------------------------------------------------------------------
# configuration and file formats

class Config:
    def __init__(self, V, C, L, NH, maxT, Vp=None):
        assert C % NH == 0, "C must be a multiple of NH"
        self.V, self.C, self.L, self.NH, self.maxT = V, C, L, NH, maxT
        self.Vp = Vp if Vp is not None else ((V + 127) // 128) * 128
        assert self.Vp >= V

    def shapes(self):
        V, C, L, Vp, maxT = self.V, self.C, self.L, self.Vp, self.maxT
        return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C),
                (L, C, C), (L, C), (L, C), (L, C), (L, 4 * C, C), (L, 4 * C),
                (L, C, 4 * C), (L, C), (C,), (C,)]

    def nparams(self):
        return sum(int(np.prod(s)) for s in self.shapes())

    def header(self):
        h = np.zeros(HEADER_INTS, dtype="<i4")
        h[:8] = [MODEL_MAGIC, 3, self.maxT, self.V, self.L, self.NH, self.C,
                 self.Vp]
        return h

    def __repr__(self):
        return ("V=%d Vp=%d C=%d L=%d NH=%d maxT=%d"
                % (self.V, self.Vp, self.C, self.L, self.NH, self.maxT))


def write_model(path, cfg, params):
    with open(path, "wb") as f:
        cfg.header().tofile(f)
        for name, shape, p in zip(NAMES, cfg.shapes(), params):
            a = np.ascontiguousarray(p, dtype="<f4")
            assert a.shape == tuple(shape), (name, a.shape, shape)
            a.tofile(f)


def read_model(path):
    """Returns (cfg, header, [16 float64 arrays]); raises ValueError."""
    raw = open(path, "rb").read()
    if len(raw) < HEADER_INTS * 4:
        raise ValueError("%s: file too short for a header (%d bytes)"
                         % (path, len(raw)))
    h = np.frombuffer(raw[:HEADER_INTS * 4], dtype="<i4").copy()
    if h[0] != MODEL_MAGIC:
        raise ValueError("%s: bad magic %d" % (path, h[0]))
    if h[1] != 3:
        raise ValueError("%s: version %d, expected 3 (fp32)" % (path, h[1]))
    cfg = Config(V=int(h[3]), C=int(h[6]), L=int(h[4]), NH=int(h[5]),
                 maxT=int(h[2]), Vp=int(h[7]))
    n = cfg.nparams()
    want = HEADER_INTS * 4 + 4 * n
    if len(raw) != want:
        raise ValueError("%s: size %d bytes, expected %d for %r"
                         % (path, len(raw), want, cfg))
    flat = np.frombuffer(raw[HEADER_INTS * 4:], dtype="<f4").astype(np.float64)
    out, off = [], 0
    for shape in cfg.shapes():
        k = int(np.prod(shape))
        out.append(flat[off:off + k].reshape(shape))
        off += k
    return cfg, h, out


def write_tokens(path, tokens):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:3] = [TOKEN_MAGIC, 1, len(tokens)]
    with open(path, "wb") as f:
        h.tofile(f)
        np.asarray(tokens, dtype="<u2").tofile(f)


def read_tokens(path):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:HEADER_INTS * 4], dtype="<i4")
    if h[0] != TOKEN_MAGIC or h[1] != 1:
        raise ValueError("%s: bad token file header" % path)
    tok = np.frombuffer(raw[HEADER_INTS * 4:], dtype="<u2")
    if len(tok) != h[2]:
        raise ValueError("%s: header says %d tokens, file has %d"
                         % (path, h[2], len(tok)))
    return tok.astype(np.int64)


def random_model(cfg, seed):
    """Small random GPT-2. Matrices ~N(0, std); LayerNorm weights 1 + noise,
    biases small noise (nonzero, so their gradients are exercised).
    Padded wte rows are zero, as in llm.c files."""
    rng = np.random.RandomState(seed)
    V, C, L, Vp, maxT = cfg.V, cfg.C, cfg.L, cfg.Vp, cfg.maxT
    n = rng.standard_normal
    wte = np.zeros((Vp, C))
    wte[:V] = 0.1 * n((V, C))
    p = {
        "wte": wte,
        "wpe": 0.05 * n((maxT, C)),
        "ln1w": 1.0 + 0.1 * n((L, C)),
        "ln1b": 0.02 * n((L, C)),
        # a larger std for qkv so attention is clearly non-uniform
        "qkvw": 0.1 * n((L, 3 * C, C)),
        "qkvb": 0.02 * n((L, 3 * C)),
        "attprojw": 0.05 * n((L, C, C)),
        "attprojb": 0.02 * n((L, C)),
        "ln2w": 1.0 + 0.1 * n((L, C)),
        "ln2b": 0.02 * n((L, C)),
        "fcw": 0.08 * n((L, 4 * C, C)),
        "fcb": 0.05 * n((L, 4 * C)),
        "fcprojw": 0.05 * n((L, C, 4 * C)),
        "fcprojb": 0.02 * n((L, C)),
        "lnfw": 1.0 + 0.1 * n((C,)),
        "lnfb": 0.02 * n((C,)),
    }
    # round to fp32, which is what the file holds
    return [p[k].astype(np.float32).astype(np.float64) for k in NAMES]


def hf_gpt2(cfg, params, prefix, masks):
    """GPT2LMHeadModel's tensors: Conv1D weights stored (in, out), i.e. transposed; V rows of
    wte; optionally the "transformer." prefix, the old attn.bias mask buffers and lm_head."""
    P = dict(zip(NAMES, params))
    t = [(prefix + "wte.weight", P["wte"][:cfg.V]), (prefix + "wpe.weight", P["wpe"])]
    for l in range(cfg.L):
        h = prefix + "h.%d." % l
        t += [(h + "ln_1.weight", P["ln1w"][l]), (h + "ln_1.bias", P["ln1b"][l]),
              (h + "attn.c_attn.weight", P["qkvw"][l].T), (h + "attn.c_attn.bias", P["qkvb"][l]),
              (h + "attn.c_proj.weight", P["attprojw"][l].T), (h + "attn.c_proj.bias", P["attprojb"][l]),
              (h + "ln_2.weight", P["ln2w"][l]), (h + "ln_2.bias", P["ln2b"][l]),
              (h + "mlp.c_fc.weight", P["fcw"][l].T), (h + "mlp.c_fc.bias", P["fcb"][l]),
              (h + "mlp.c_proj.weight", P["fcprojw"][l].T), (h + "mlp.c_proj.bias", P["fcprojb"][l])]
        if masks:
            t.append((h + "attn.bias", np.tril(np.ones((cfg.maxT, cfg.maxT)))[None, None]))
    t += [(prefix + "ln_f.weight", P["lnfw"]), (prefix + "ln_f.bias", P["lnfb"])]
    if masks:
        t.append(("lm_head.weight", P["wte"][:cfg.V]))
    return t


def hf_gpt2_config(cfg):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.V,
            "n_positions": cfg.maxT, "n_ctx": cfg.maxT, "n_embd": cfg.C, "n_layer": cfg.L, "n_head": cfg.NH,
            "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": True}


def batch(tokens, k, B, T):
    """Batch k (0-based): tokens[k*B*T : k*B*T + B*T + 1]."""
    start = k * B * T
    buf = tokens[start:start + B * T + 1]
    if len(buf) != B * T + 1:
        raise ValueError("token file too short for batch %d" % k)
    return buf[:-1].reshape(B, T), buf[1:].reshape(B, T)


# ----------------------------------------------------------------------------
# the model (written out explicitly; no nn.Module helpers)

def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)        # biased variance
    return xc / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * x * x * x)))


def forward_loss(cfg, P, inp, tgt):
    """P: list of 16 tensors (llm.c layout). inp, tgt: (B,T) int64 tensors.
    Returns the mean cross-entropy over all B*T positions."""
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, \
        fcw, fcb, fcprojw, fcprojb, lnfw, lnfb = P
    B, T = inp.shape
    C, NH, V = cfg.C, cfg.NH, cfg.V
    hs = C // NH
    x = wte[inp] + wpe[:T]                               # (B,T,C)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg.L):
        h = layernorm(x, ln1w[l], ln1b[l])
        qkv = h @ qkvw[l].t() + qkvb[l]                  # (B,T,3C)
        q = qkv[..., 0:C].reshape(B, T, NH, hs).transpose(1, 2)
        k = qkv[..., C:2 * C].reshape(B, T, NH, hs).transpose(1, 2)
        v = qkv[..., 2 * C:3 * C].reshape(B, T, NH, hs).transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1)
        y = (a @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ attprojw[l].t() + attprojb[l])
        h = layernorm(x, ln2w[l], ln2b[l])
        h = gelu_tanh(h @ fcw[l].t() + fcb[l])
        x = x + (h @ fcprojw[l].t() + fcprojb[l])
    x = layernorm(x, lnfw, lnfb)
    logits = x @ wte[:V].t()                             # (B,T,V)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).mean()


def loss_and_grads(cfg, params_np, inp, tgt, dtype=torch.float64):
    P = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in params_np]
    loss = forward_loss(cfg, P, torch.as_tensor(inp), torch.as_tensor(tgt))
    loss.backward()
    return float(loss), [p.grad.detach().double().numpy() for p in P]


def adamw_update(params, grads, m, v, t, hp):
    """One AdamW step in place (numpy, float64). t is 1-based."""
    b1, b2, lr, eps, wd = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"], hp["wd"]
    c1 = 1.0 - b1 ** t
    c2 = 1.0 - b2 ** t
    for i, name in enumerate(NAMES):
        g = grads[i]
        m[i] = b1 * m[i] + (1.0 - b1) * g
        v[i] = b2 * v[i] + (1.0 - b2) * g * g
        upd = (m[i] / c1) / (np.sqrt(v[i] / c2) + eps)
        if name in DECAY:
            upd = upd + wd * params[i]
        params[i] = params[i] - lr * upd


def reference_train(cfg, params_np, tokens, B, T, steps, hp,
                    dtype=torch.float64):
    """Returns (losses per step, step-1 gradients)."""
    params = [p.copy() for p in params_np]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses, grads1 = [], None
    for s in range(steps):
        inp, tgt = batch(tokens, s, B, T)
        if dtype == torch.float32:
            params = [p.astype(np.float32).astype(np.float64) for p in params]
        loss, grads = loss_and_grads(cfg, params, inp, tgt, dtype)
        losses.append(loss)
        if s == 0:
            grads1 = grads
        adamw_update(params, grads, m, v, s + 1, hp)
    return losses, grads1


# ----------------------------------------------------------------------------
# comparison against pipelm

DEFAULT_HP = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1)


def rel_err(a, b, tiny=1e-30):
    return float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), tiny)


def run_pipelm(args, workdir, model_path, data_path, B, T, steps, hp):
    metrics = os.path.join(workdir, "metrics.jsonl")
    gradp = os.path.join(workdir, "grads.bin")
    for f in (metrics, gradp):
        if os.path.exists(f):
            os.remove(f)
    cmd = []
    if args.timeout > 0 and shutil.which("timeout"):
        cmd += ["timeout", str(args.timeout)]
    if args.launcher:
        cmd += shlex.split(args.launcher)
    cmd += [args.pipelm, "train", "--init", model_path, "--data", data_path,
            "--batch", str(B), "--seq-len", str(T), "--steps", str(steps),
            "--microbatches", "1", "--lr", repr(hp["lr"]),
            "--lr-schedule", "constant", "--warmup-steps", "0",
            "--weight-decay", repr(hp["wd"]), "--grad-clip", "0",
            "--beta1", repr(hp["beta1"]), "--beta2", repr(hp["beta2"]),
            "--eps", repr(hp["eps"]), "--seed", "1",
            "--metrics", metrics, "--dump-grads", gradp]
    print("running: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT,
                           timeout=(args.timeout + 30) if args.timeout > 0 else None)
    except subprocess.TimeoutExpired:
        return None, "pipelm did not finish within %d s" % args.timeout, None, None
    except OSError as e:
        return None, "cannot run pipelm: %s" % e, None, None
    out = r.stdout.decode("utf-8", "replace")
    with open(os.path.join(workdir, "pipelm.log"), "w") as f:
        f.write(out)
    print("pipelm exited with %d after %.1f s" % (r.returncode, time.time() - t0))
    if r.returncode != 0:
        tail = "\n".join(out.splitlines()[-30:])
        why = "timed out" if r.returncode in (124, 137) else "failed"
        return None, "pipelm %s (exit %d); output tail:\n%s" % (
            why, r.returncode, tail), None, None
    return out, None, metrics, gradp


def parse_metrics(path):
    """Returns {step: loss} from lines with "event": "step" (first one wins)."""
    losses = {}
    bad = 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if d.get("event") != "step":
                continue
            s = int(d["step"])
            if s not in losses:
                losses[s] = float(d["loss"])
    return losses, bad


def compare(args):
    cfg = Config(V=args.V, C=args.C, L=args.L, NH=args.NH, maxT=args.maxT)
    B, T, S = args.batch, args.seq_len, args.steps
    hp = dict(DEFAULT_HP)
    if T > cfg.maxT:
        print("seq-len %d > maxT %d" % (T, cfg.maxT))
        return 2
    if args.keep:
        workdir = os.path.abspath(args.keep)
        os.makedirs(workdir, exist_ok=True)
    else:
        workdir = tempfile.mkdtemp(prefix="torch_ref.")
    try:
        return _compare(args, cfg, B, T, S, hp, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print("files are in %s" % workdir)


def _compare(args, cfg, B, T, S, hp, workdir):
    print("model: %r, B=%d T=%d steps=%d, params=%d"
          % (cfg, B, T, S, cfg.nparams()))
    params = random_model(cfg, args.seed)
    rng = np.random.RandomState(args.seed + 1)
    ntok = max(args.ntokens, S * B * T + 1)
    tokens = rng.randint(0, cfg.V, size=ntok).astype(np.int64)
    model_path = os.path.join(workdir, "model.bin")
    data_path = os.path.join(workdir, "tokens.bin")
    if args.hf_dtype:   # a Hugging Face directory instead, values as the dtype holds them
        params = [st_write.round_to(p, args.hf_dtype) for p in params]
        model_path = os.path.join(workdir, "hf")
        st_write.write_model_dir(model_path, hf_gpt2_config(cfg),
                                 hf_gpt2(cfg, params, "transformer." if args.hf_prefix else "", args.hf_prefix),
                                 args.hf_dtype)
        print("Hugging Face GPT-2 files: %s, %s" % (args.hf_dtype, "with the transformer. prefix, attn.bias "
              "masks and lm_head" if args.hf_prefix else "no prefix"))
    else:
        write_model(model_path, cfg, params)
        # sanity: our own files read back exactly
        c2, _, p2 = read_model(model_path)
        assert repr(c2) == repr(cfg) and all(np.array_equal(a, b)
                                             for a, b in zip(params, p2))
    write_tokens(data_path, tokens)
    assert np.array_equal(read_tokens(data_path), tokens)

    out, err, metrics_path, grads_path = run_pipelm(
        args, workdir, model_path, data_path, B, T, S, hp)
    if err:
        print(err)
        print("FAIL: pipelm did not run")
        return 1

    t0 = time.time()
    ref_losses, ref_grads = reference_train(cfg, params, tokens, B, T, S, hp,
                                            torch.float64)
    print("reference (float64 torch) computed in %.1f s" % (time.time() - t0))

    failures = []

    # ---- losses
    print()
    print("losses (tolerance: relative error <= %g; steps >= 2 also <= %g)"
          % (args.loss_tol, args.strict_loss_tol))
    if not os.path.exists(metrics_path):
        failures.append("no metrics file written")
        got = {}
    else:
        got, bad = parse_metrics(metrics_path)
        if bad:
            print("warning: %d metrics lines are not valid JSON" % bad)
    print("  %4s  %16s  %16s  %10s" % ("step", "pipelm", "torch", "rel.err"))
    for s in range(1, S + 1):
        ref = ref_losses[s - 1]
        if s not in got:
            print("  %4d  %16s  %16.10f  %10s  MISSING" % (s, "-", ref, "-"))
            failures.append("no loss for step %d in metrics" % s)
            continue
        e = abs(got[s] - ref) / abs(ref)
        ok = e <= args.loss_tol
        strict_ok = s == 1 or e <= args.strict_loss_tol
        print("  %4d  %16.10f  %16.10f  %10.3e  %s"
              % (s, got[s], ref, e, "FAIL" if not ok else
                 "ok" if strict_ok else "FAIL (strict)"))
        if not ok:
            failures.append("step %d loss rel.err %.3e" % (s, e))
        elif not strict_ok:
            failures.append("step %d loss rel.err %.3e > strict tolerance %g "
                            "(float32 rounding gives ~1e-7; no weight decay "
                            "gives ~2e-5)" % (s, e, args.strict_loss_tol))

    # ---- gradients
    print()
    print("step-1 gradients (tolerance: max|a-b| / max|b| <= %g)" % args.grad_tol)
    if not os.path.exists(grads_path):
        failures.append("no gradient dump written")
    else:
        try:
            gcfg, gh, pg = read_model(grads_path)
        except ValueError as e:
            failures.append("gradient dump unreadable: %s" % e)
            pg = None
        if pg is not None:
            want = cfg.header()
            if not np.array_equal(gh, want):
                diff = [i for i in range(HEADER_INTS) if gh[i] != want[i]]
                failures.append("gradient dump header differs at ints %s"
                                % diff[:10])
            print("  %-9s %-14s %12s %12s %10s" % (
                "tensor", "shape", "max|torch|", "max|diff|", "rel.err"))
            rows = []
            for name, a, b in zip(NAMES, pg, ref_grads):
                rows.append((name, a, b))
                if name == "wte":
                    rows.append(("wte[:V]", a[:cfg.V], b[:cfg.V]))
            for name, a, b in rows:
                if not np.all(np.isfinite(a)):
                    print("  %-9s %-14s  non-finite values!" % (name, a.shape))
                    failures.append("%s has non-finite gradients" % name)
                    continue
                e = rel_err(a, b)
                ok = e <= args.grad_tol
                print("  %-9s %-14s %12.4e %12.4e %10.3e  %s" % (
                    name, "x".join(map(str, a.shape)), np.max(np.abs(b)),
                    np.max(np.abs(a - b)), e, "ok" if ok else "FAIL"))
                if not ok:
                    failures.append("gradient %s rel.err %.3e" % (name, e))
            pad = pg[0][cfg.V:]
            if pad.size:
                mx = float(np.max(np.abs(pad)))
                print("  padded wte grad rows %d..%d: max|g| = %g  %s"
                      % (cfg.V, cfg.Vp - 1, mx, "ok" if mx == 0 else "FAIL"))
                if mx != 0:
                    failures.append("padded wte gradient rows are not zero")
            if T < cfg.maxT:
                mx = float(np.max(np.abs(pg[1][T:])))
                print("  wpe grad rows %d..%d (unused positions): max|g| = %g  %s"
                      % (T, cfg.maxT - 1, mx, "ok" if mx == 0 else "FAIL"))
                if mx != 0:
                    failures.append("wpe gradient rows >= T are not zero")

    print()
    if failures:
        print("FAIL: %d problem(s):" % len(failures))
        for f in failures:
            print("  - " + f)
        return 1
    print("PASS: pipelm matches the torch reference (%d losses, %d gradient "
          "tensors)" % (S, len(NAMES)))
    return 0


# ----------------------------------------------------------------------------
# stand-in pipelm (float32 torch), used by --selftest to test the plumbing

def fake_pipelm(argv):
    ap = argparse.ArgumentParser(prog="fake-pipelm")
    ap.add_argument("cmd")
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--dump-grads")
    a, _unknown = ap.parse_known_args(argv)
    assert a.cmd == "train"
    cfg, header, params = read_model(a.init)
    tokens = read_tokens(a.data)
    hp = dict(lr=a.lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps,
              wd=a.weight_decay)
    bug = os.environ.get("TORCH_REF_FAKE_BUG", "")
    if bug == "wd":
        hp["wd"] = 0.0
    losses, g1 = reference_train(cfg, params, tokens, a.batch, a.seq_len,
                                 a.steps, hp, torch.float32)
    if bug == "grad":
        g1[15] = g1[15] * 1.01
    if bug == "pad":
        g1[0][cfg.V:] = 1e-9
    with open(a.metrics, "w") as f:
        f.write(json.dumps({"event": "start", "note": "fake"}) + "\n")
        for i, l in enumerate(losses):
            f.write(json.dumps({"event": "step", "step": i + 1, "loss": l,
                                "step_ms": 1.0}) + "\n")
    if a.dump_grads:
        with open(a.dump_grads, "wb") as f:
            header.astype("<i4").tofile(f)
            for g in g1:
                g.astype("<f4").tofile(f)
    print("fake pipelm: %d steps, final loss %.6f" % (a.steps, losses[-1]))
    return 0


# ----------------------------------------------------------------------------
# self-test of the reference

def loop_forward_loss(cfg, P, inp, tgt):
    """Plain numpy float64 forward, one position / head at a time."""
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, \
        fcw, fcb, fcprojw, fcprojb, lnfw, lnfb = P
    B, T = inp.shape
    C, NH, V = cfg.C, cfg.NH, cfg.V
    hs = C // NH

    def ln(vec, w, b):
        mu = sum(vec) / len(vec)
        var = sum((e - mu) ** 2 for e in vec) / len(vec)
        return (vec - mu) / math.sqrt(var + 1e-5) * w + b

    def gelu(u):
        return np.array([0.5 * e * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                  * (e + 0.044715 * e ** 3)))
                         for e in u])

    total = 0.0
    for b in range(B):
        xs = [wte[inp[b, t]] + wpe[t] for t in range(T)]
        for l in range(cfg.L):
            qkv = [qkvw[l].dot(ln(xs[t], ln1w[l], ln1b[l])) + qkvb[l]
                   for t in range(T)]
            new = []
            for t in range(T):
                y = np.zeros(C)
                for h in range(NH):
                    lo, hi = h * hs, (h + 1) * hs
                    q = qkv[t][lo:hi]
                    sc = [q.dot(qkv[u][C + lo:C + hi]) / math.sqrt(hs)
                          for u in range(t + 1)]
                    mx = max(sc)
                    w = [math.exp(s - mx) for s in sc]
                    z = sum(w)
                    for u in range(t + 1):
                        y[lo:hi] += (w[u] / z) * qkv[u][2 * C + lo:2 * C + hi]
                new.append(xs[t] + attprojw[l].dot(y) + attprojb[l])
            xs = new
            xs = [x + fcprojw[l].dot(gelu(fcw[l].dot(ln(x, ln2w[l], ln2b[l]))
                                          + fcb[l])) + fcprojb[l] for x in xs]
        for t in range(T):
            logits = wte[:V].dot(ln(xs[t], lnfw, lnfb))
            mx = logits.max()
            lse = mx + math.log(np.exp(logits - mx).sum())
            total += lse - logits[tgt[b, t]]
    return total / (B * T)


def selftest(args):
    failures = []
    cfg = Config(V=13, C=12, L=2, NH=3, maxT=8)
    B, T = 2, 6
    params = random_model(cfg, 123)
    rng = np.random.RandomState(7)
    tokens = rng.randint(0, cfg.V, size=200).astype(np.int64)
    inp, tgt = batch(tokens, 0, B, T)

    # 1. forward vs plain loop implementation
    loss, grads = loss_and_grads(cfg, params, inp, tgt)
    loss2 = loop_forward_loss(cfg, params, inp, tgt)
    e = abs(loss - loss2) / abs(loss2)
    print("forward: torch %.15f loop %.15f rel.err %.2e" % (loss, loss2, e))
    if e > 1e-12:
        failures.append("forward mismatch vs loop implementation")

    # 2. gradients vs central finite differences (float64)
    def f(P):
        with torch.no_grad():
            return float(forward_loss(cfg, [torch.tensor(p) for p in P],
                                      torch.as_tensor(inp),
                                      torch.as_tensor(tgt)))
    h = 1e-6
    print("finite differences (h=%g), error relative to max|grad| of tensor:"
          % h)
    for i, name in enumerate(NAMES):
        g = grads[i]
        scale = max(np.max(np.abs(g)), 1e-30)
        flat_idx = list(rng.choice(g.size, size=4, replace=False))
        flat_idx.append(int(np.argmax(np.abs(g))))
        if name == "wte":        # one padded row element too
            flat_idx.append(cfg.V * cfg.C + 3)
        if name == "wpe":        # a position >= T
            flat_idx.append(T * cfg.C + 1)
        worst = 0.0
        for fi in flat_idx:
            idx = np.unravel_index(fi, g.shape)
            Pp = [p.copy() for p in params]
            Pm = [p.copy() for p in params]
            Pp[i][idx] += h
            Pm[i][idx] -= h
            fd = (f(Pp) - f(Pm)) / (2 * h)
            worst = max(worst, abs(fd - g[idx]) / scale)
        ok = worst <= 1e-6
        print("  %-9s max|g|=%.3e  worst %.2e  %s"
              % (name, scale, worst, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("finite difference mismatch for %s" % name)
    if np.any(grads[0][cfg.V:] != 0):
        failures.append("padded wte grads nonzero in reference")
    if np.any(grads[1][T:] != 0):
        failures.append("wpe grads for positions >= T nonzero in reference")

    # 3. AdamW vs torch.optim.AdamW with two param groups
    hp = dict(DEFAULT_HP)
    mine = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    tp = [torch.tensor(p, requires_grad=True) for p in params]
    opt = torch.optim.AdamW(
        [{"params": [t for t, n in zip(tp, NAMES) if n in DECAY],
          "weight_decay": hp["wd"]},
         {"params": [t for t, n in zip(tp, NAMES) if n not in DECAY],
          "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    for s in range(3):
        inp_s, tgt_s = batch(tokens, s, B, T)
        _, g = loss_and_grads(cfg, mine, inp_s, tgt_s)
        adamw_update(mine, g, m, v, s + 1, hp)
        opt.zero_grad()
        forward_loss(cfg, tp, torch.as_tensor(inp_s),
                     torch.as_tensor(tgt_s)).backward()
        opt.step()
    worst = max(float(np.max(np.abs(a - b.detach().numpy())))
                for a, b in zip(mine, tp))
    print("AdamW vs torch.optim.AdamW after 3 steps: max|diff| = %.2e" % worst)
    if worst > 1e-12:
        failures.append("AdamW mismatch vs torch.optim.AdamW")

    # 4. the whole comparison against the float32 stand-in pipelm
    tmp = tempfile.mkdtemp(prefix="torch_ref_selftest.")
    try:
        fake = os.path.join(tmp, "fake-pipelm")
        with open(fake, "w") as fh:
            fh.write("#!/bin/sh\nexec %s %s --as-fake-pipelm \"$@\"\n"
                     % (shlex.quote(sys.executable),
                        shlex.quote(os.path.abspath(__file__))))
        os.chmod(fake, 0o755)
        sub = argparse.Namespace(**vars(args))
        sub.pipelm = fake
        sub.launcher = None
        sub.keep = None
        print()
        print("=== end-to-end against the float32 stand-in pipelm ===")
        rc = compare(sub)
        if rc != 0:
            failures.append("end-to-end comparison with float32 stand-in failed")
        # the comparison must also notice planted bugs
        for bug in ("grad", "pad", "wd"):
            print()
            print("=== planted bug %r in the stand-in: expecting FAIL ===" % bug)
            os.environ["TORCH_REF_FAKE_BUG"] = bug
            try:
                rc = compare(sub)
            finally:
                del os.environ["TORCH_REF_FAKE_BUG"]
            if rc == 0:
                failures.append("planted bug %r was not detected" % bug)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    if failures:
        print("SELFTEST FAIL:")
        for f_ in failures:
            print("  - " + f_)
        return 1
    print("SELFTEST PASS")
    return 0


# ----------------------------------------------------------------------------

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--as-fake-pipelm":
        return fake_pipelm(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelm", help="path to the pipelm binary")
    ap.add_argument("--keep", metavar="DIR",
                    help="work in DIR and keep the files (model, tokens, "
                         "metrics, grads, log)")
    ap.add_argument("--selftest", action="store_true",
                    help="check the reference itself (no pipelm needed)")
    ap.add_argument("--launcher", help="command prefix, e.g. 'mpirun -np 1'")
    ap.add_argument("--timeout", type=int, default=120,
                    help="seconds allowed for the pipelm run (0: none)")
    ap.add_argument("--V", type=int, default=97)
    ap.add_argument("--C", type=int, default=48)
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--NH", type=int, default=3)
    ap.add_argument("--maxT", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ntokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--grad-tol", type=float, default=1e-3)
    ap.add_argument("--strict-loss-tol", type=float, default=1e-5,
                    help="extra tolerance for the losses of steps >= 2, "
                         "tight enough to see the weight decay term")
    ap.add_argument("--hf-dtype", choices=st_write.DTYPES,
                    help="give pipelm the model as Hugging Face files of this dtype")
    ap.add_argument("--hf-prefix", action="store_true",
                    help="with --hf-dtype: names with transformer., the attn.bias masks and lm_head")
    ap.add_argument("--write-hf", metavar="DIR", help="write the test GPT-2 as a Hugging Face directory and exit")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.write_hf:
        cfg = Config(args.V, args.C, args.L, args.NH, args.maxT)
        st_write.write_model_dir(args.write_hf, hf_gpt2_config(cfg), hf_gpt2(cfg, random_model(cfg, args.seed),
                                 "transformer.", True), args.hf_dtype or "F32")
        return 0
    if args.selftest:
        return selftest(args)
    if not args.pipelm:
        ap.error("--pipelm PATH is required (or use --selftest)")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
