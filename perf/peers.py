#!/usr/bin/env python3
"""PyTorch peers of hk: the forward of spec/MODEL.md as PyTorch users would run it, timed on
the same GPU and with the same synthetic inputs as hk, case by case from cases.csv.

Peers, per case:
  eager          fp32 baseline module (nn.Linear q/k/v/out, nn.LayerNorm, masked softmax over
                 a materialised [B, H, S, S] score tensor, exact GELU), TF32 off.
  sdpa_eager     the strong forward below, not compiled (what the compiler starts from).
  compile_graph  strong forward under torch.compile (default mode), replayed from a
                 torch.cuda.CUDAGraph capture.
  compile_autotune  strong forward under torch.compile(mode="max-autotune-no-cudagraphs").
  compiled       the faster of the two compiled variants that pass the accuracy check.
The strong forward: fp16 weights, fused QKV weight [3D, D], F.scaled_dot_product_attention
(is_causal=True and no mask under causal; a boolean key mask otherwise), fp32 residual
stream and LayerNorm.

Every peer's output is checked against the float64 reference of apps/hk_reference.py on the
first --check-batch sequences (eager: max abs err <= 1e-4; fast peers: the MODEL.md budget),
so a broken peer cannot look fast.

Compile time dominates a full run. Pass 1 runs eager, sdpa_eager and compile_graph per case;
pass 2 spends what is left of --budget-seconds on compile_autotune, slowest cases first.
Cases that miss a variant for lack of time are listed; rerun them with --cases-only.

  peers.py [--cases cases.csv] [--cases-only 1,2,5] [--json out.json] [--skip-compile]
           [--compile-cases 1,6] [--autotune-cases 6,8] [--max-seconds 120]
           [--budget-seconds 300] [--device cuda|cpu]

Works with torch 1.13 (CPU, eager peers only) and torch 2.x.
"""

import argparse
import csv
import datetime
import io
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "apps"))
sys.dont_write_bytecode = True  # keep apps/ free of __pycache__ in the source tree
import hk_reference  # noqa: E402  (the float64 reference every peer is checked against)

# Copy of spec/cases.csv, used only when no cases.csv can be found (the device machine may
# not carry the shared tree); the run says when it falls back to it.
BUILTIN_CASES = """case,B,S,D,H,F,L,causal,note
1,64,128,128,4,128,4,1,baseline mid-size
2,1,128,128,4,128,4,1,launch-bound: 128 tokens
3,512,32,128,4,128,4,1,short sequences
4,64,128,64,4,64,4,1,narrow model
5,256,256,128,8,128,4,0,bidirectional with padding mask
6,10000,128,128,4,128,4,1,1.28M tokens: the big batch
7,64,128,128,16,128,4,1,head_dim 8
8,64,128,1024,4,1024,4,1,head_dim 256: compute-bound
9,64,128,128,1,128,4,1,single head: head_dim 128
10,16,512,128,4,128,4,0,longer bidirectional
11,1024,128,128,16,128,4,1,head_dim 8 at scale
12,128,128,256,8,256,4,0,d_model 256 bidirectional
13,64,1024,128,4,128,4,1,long causal: the big score matrix
"""

EPS = 1e-5
FP32_ATOL = 1e-4                         # MODEL.md fp32 budget (max abs err)
FAST_ATOL, FAST_RTOL = hk_reference.DEFAULT_ATOL, hk_reference.DEFAULT_RTOL


# ----------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------

def parse_cases(text):
    cases = []
    for row in csv.DictReader(io.StringIO(text)):
        c = {k: int(row[k]) for k in ("case", "B", "S", "D", "H", "F", "L", "causal")}
        c["note"] = row.get("note", "")
        cases.append(c)
    return cases


def load_cases(path):
    if path:
        with open(path) as f:
            return parse_cases(f.read()), path
    for cand in (os.path.join(REPO, "shared", "spec", "cases.csv"),
                 os.path.join(REPO, "..", "shared", "spec", "cases.csv")):
        if os.path.exists(cand):
            with open(cand) as f:
                return parse_cases(f.read()), os.path.normpath(cand)
    return parse_cases(BUILTIN_CASES), "built-in copy of spec/cases.csv"


def parse_id_list(s, name):
    if s is None:
        return None
    if s.strip().lower() in ("all", ""):
        return None
    try:
        return [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        raise SystemExit("peers.py: %s expects a comma-separated list of case numbers" % name)


# ----------------------------------------------------------------------------------------
# (a) The eager fp32 baseline module; its state_dict names are those of MODEL.md
# ----------------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.H = H
        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    def forward(self, h, allowed):
        B, S, D = h.shape
        hd = D // self.H

        def heads(t):
            return t.view(B, S, self.H, hd).transpose(1, 2)

        q, k, v = heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)     # [B, H, S, S]
        scores = scores.masked_fill(~allowed, float("-inf"))
        o = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out_proj(o.transpose(1, 2).reshape(B, S, D))


class Layer(nn.Module):
    def __init__(self, D, H, F_, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, eps=eps)
        self.attn = Attention(D, H)
        self.norm2 = nn.LayerNorm(D, eps=eps)
        self.ffn_in = nn.Linear(D, F_)
        self.ffn_out = nn.Linear(F_, D)

    def forward(self, x, allowed):
        x = x + self.attn(self.norm1(x), allowed)
        return x + self.ffn_out(F.gelu(self.ffn_in(self.norm2(x))))


class BaselineTransformer(nn.Module):
    def __init__(self, D, H, F_, L, causal, eps=EPS):
        super().__init__()
        self.causal = bool(causal)
        self.layers = nn.ModuleList([Layer(D, H, F_, eps) for _ in range(L)])
        self.final_norm = nn.LayerNorm(D, eps=eps)

    def forward(self, x, lengths):
        S = x.shape[1]
        pos = torch.arange(S, device=x.device)
        valid = pos[None, :] < lengths[:, None]                          # [B, S]
        allowed = valid[:, None, None, :]
        if self.causal:
            allowed = allowed & (pos[None, :] <= pos[:, None])[None, None]
        for layer in self.layers:
            x = layer(x, allowed)
        y = self.final_norm(x)
        return y * valid[:, :, None].to(y.dtype)


# ----------------------------------------------------------------------------------------
# (b) The strong forward: fp16 weights, fused QKV, SDPA, fp32 residual and LayerNorm
# ----------------------------------------------------------------------------------------

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def _sdpa(q, k, v, attn_mask, is_causal):
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    # torch < 2.0 has no SDPA: same semantics spelled out, so the layout of the strong
    # forward (QKV split, head permutes, masks) can still be checked on such a torch.
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), -math.inf)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf)
    return torch.matmul(torch.softmax(s, dim=-1), v)


class _StrongLayer(nn.Module):
    """One layer's parameters in the strong forward's layout (buffers: nothing trains)."""

    def __init__(self, layer, half):
        super().__init__()
        a = layer.attn

        def buf(name, t):
            self.register_buffer(name, t.detach().clone().contiguous())

        buf("wqkv", torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).to(half))
        buf("bqkv", torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).to(half))
        buf("wo", a.out_proj.weight.to(half))
        buf("bo", a.out_proj.bias.to(half))
        buf("wi", layer.ffn_in.weight.to(half))
        buf("bi", layer.ffn_in.bias.to(half))
        buf("wf", layer.ffn_out.weight.to(half))
        buf("bf", layer.ffn_out.bias.to(half))
        buf("n1w", layer.norm1.weight.float())
        buf("n1b", layer.norm1.bias.float())
        buf("n2w", layer.norm2.weight.float())
        buf("n2b", layer.norm2.bias.float())


class StrongForward(nn.Module):
    def __init__(self, base, H, half):
        super().__init__()
        self.H = H
        self.causal = base.causal
        self.half = half
        self.eps = base.final_norm.eps
        self.blocks = nn.ModuleList([_StrongLayer(layer, half) for layer in base.layers])
        self.register_buffer("nfw", base.final_norm.weight.detach().float().clone())
        self.register_buffer("nfb", base.final_norm.bias.detach().float().clone())

    def forward(self, x, lengths):
        B, S, D = x.shape
        H = self.H
        hd = D // H
        valid = torch.arange(S, device=x.device)[None, :] < lengths[:, None]
        # Under causal with right padding the key mask changes no valid row (MODEL.md):
        # drop it so SDPA can take its mask-free causal path.
        mask = None if self.causal else valid[:, None, None, :]
        for blk in self.blocks:
            h = F.layer_norm(x, (D,), blk.n1w, blk.n1b, self.eps).to(self.half)
            qkv = F.linear(h, blk.wqkv, blk.bqkv).view(B, S, 3, H, hd).permute(2, 0, 3, 1, 4)
            o = _sdpa(qkv[0], qkv[1], qkv[2], mask, self.causal)
            o = o.transpose(1, 2).reshape(B, S, D)
            x = x + F.linear(o, blk.wo, blk.bo).float()
            h = F.layer_norm(x, (D,), blk.n2w, blk.n2b, self.eps).to(self.half)
            x = x + F.linear(F.gelu(F.linear(h, blk.wi, blk.bi)), blk.wf, blk.bf).float()
        y = F.layer_norm(x, (D,), self.nfw, self.nfb, self.eps)
        return y * valid[:, :, None].to(y.dtype)


# ----------------------------------------------------------------------------------------
# Building a case, checking and timing
# ----------------------------------------------------------------------------------------

def build_case(c, device, seed):
    """Synthetic case per MODEL.md: PyTorch default init, x ~ N(0,1), lengths ~ U{1..S}."""
    torch.manual_seed(seed * 1000 + c["case"])  # weights on CPU: identical on every device
    model = BaselineTransformer(c["D"], c["H"], c["F"], c["L"], c["causal"]).eval()
    model.requires_grad_(False)
    model = model.to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1000 + c["case"])
    x = torch.randn(c["B"], c["S"], c["D"], generator=gen, device=device)
    lengths = torch.randint(1, c["S"] + 1, (c["B"],), generator=gen, device=device,
                            dtype=torch.int64).to(torch.int32)
    return model, x, lengths


def reference_subset(model, c, x, lengths, n):
    cfg = hk_reference.Config(c["D"], c["H"], c["L"], c["F"], bool(c["causal"]), EPS)
    params = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    with torch.no_grad():
        return hk_reference.forward(params, cfg, x[:n].to(torch.float64), lengths[:n])


def accuracy(y, ref, fast):
    """Error of y[:n] against the float64 reference; fast peers get the MODEL.md budget."""
    n = ref.shape[0]
    d = y[:n].to(torch.float64)
    finite = torch.isfinite(d)
    err = torch.where(finite, (d - ref).abs(), torch.full_like(d, float("inf")))
    tol = torch.clamp(FAST_RTOL * ref.abs(), min=FAST_ATOL)
    max_err = float(err.max())
    ratio = float((err / tol).max())
    nonfinite = int((~finite).sum())
    ok = nonfinite == 0 and (ratio <= 1.0 if fast else max_err <= FP32_ATOL)
    return {"max_abs_err": max_err, "budget_ratio": ratio, "nonfinite": nonfinite, "ok": ok,
            "check": "budget max(%g, %g|ref|)" % (FAST_ATOL, FAST_RTOL) if fast
            else "max abs err <= %g" % FP32_ATOL, "check_batch": n}


class Timer:
    def __init__(self, device, min_reps, max_reps, target_s):
        self.cuda = torch.device(device).type == "cuda"
        self.min_reps, self.max_reps, self.target_s = min_reps, max_reps, target_s

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _once(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def __call__(self, fn, time_left_s):
        """Median ms over >= min_reps calls (more for fast fns, fewer if time is short)."""
        for _ in range(3):
            fn()
        self.sync()
        est_ms = max(1e-3, min(self._once(fn) for _ in range(2)))
        budget_s = max(0.0, min(self.target_s, time_left_s))
        reps = int(budget_s * 1e3 / est_ms)
        reps = max(self.min_reps, min(self.max_reps, reps))
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
            for a, b in ev:
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            ms = [a.elapsed_time(b) for a, b in ev]
        else:
            ms = [self._once(fn) for _ in range(reps)]
        return {"ms": statistics.median(ms), "min_ms": min(ms), "reps": reps}


def disable_tf32():
    """fp32 matmuls in full fp32. Only the legacy flags are written: torch 2.9+ raises
    ("mix of legacy and new APIs") when inductor reads legacy flags after a write through
    the per-backend fp32_precision API, and False is their default anyway."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if hasattr(torch, "set_float32_matmul_precision"):
            torch.set_float32_matmul_precision("highest")


def tf32_state():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {}
        for name, get in (("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                          ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                          ("float32_matmul_precision",
                           lambda: torch.get_float32_matmul_precision())):
            try:
                state[name] = get()
            except Exception as e:  # reported, never fatal
                state[name] = "unreadable: %s" % str(e)[:80]
        return state


def dynamo_reset():
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()


def free(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Runner:
    def __init__(self, args, device):
        self.args = args
        self.device = device
        self.cuda = torch.device(device).type == "cuda"
        self.timer = Timer(device, args.min_reps, args.max_reps, args.target_seconds)
        self.t_start = time.time()
        # CPU has no fp16 GEMM in older torch; there the strong forward runs in fp32 and
        # only its layout and masking are meaningful.
        self.half = torch.float16 if self.cuda else torch.float32

    def time_left(self):
        return self.args.budget_seconds - (time.time() - self.t_start)

    def measure(self, name, fn, ref, fast, rec, case_t0, extra=None):
        left = min(self.time_left(), self.args.max_seconds - (time.time() - case_t0))
        try:
            with torch.no_grad():
                t = self.timer(fn, left)
                y = fn()
                self.timer.sync()
                acc = accuracy(y, ref, fast)
        except Exception as e:  # a peer that fails to run is reported, never fatal
            self.skip(rec, name, "error: %s" % first_line(e))
            return
        r = dict(t)
        r.update(acc)
        if extra:
            r.update(extra)
        rec[name] = r
        flag = "" if acc["ok"] else "  ACCURACY FAIL"
        print("  %-17s %9.3f ms  (%d reps)  max abs err %.2e  ratio %.3f%s"
              % (name, t["ms"], t["reps"], acc["max_abs_err"], acc["budget_ratio"], flag),
              flush=True)

    def skip(self, rec, name, why):
        rec.setdefault("skipped", {})[name] = why
        print("  %-17s skipped: %s" % (name, why), flush=True)

    def compile_guard(self, case_t0):
        if self.time_left() <= 0:
            return "run budget (--budget-seconds %g) spent" % self.args.budget_seconds
        if time.time() - case_t0 > self.args.max_seconds:
            return "per-case budget (--max-seconds %g) spent" % self.args.max_seconds
        return None

    def pass1(self, c, compile_it):
        rec = {k: c[k] for k in ("case", "B", "S", "D", "H", "F", "L", "causal", "note")}
        print("case %d: B=%d S=%d D=%d H=%d F=%d L=%d causal=%d  (%s)"
              % (c["case"], c["B"], c["S"], c["D"], c["H"], c["F"], c["L"], c["causal"],
                 c["note"]), flush=True)
        t0 = time.time()
        self._pass1_peers(c, compile_it, rec, t0)
        # The case's tensors died with the call above; drop compiled code and cached blocks
        # before the next case so big cases do not stack up.
        dynamo_reset()
        free(self.device)
        rec["case_seconds"] = time.time() - t0
        return rec

    def _pass1_peers(self, c, compile_it, rec, t0):
        model, x, lengths = build_case(c, self.device, self.args.seed)
        ref = reference_subset(model, c, x, lengths, min(c["B"], self.args.check_batch))
        self.measure("eager", lambda: model(x, lengths), ref, False, rec, t0)
        strong = StrongForward(model, c["H"], self.half).to(self.device).eval()
        self.measure("sdpa_eager", lambda: strong(x, lengths), ref, True, rec, t0)
        if not compile_it:
            self.skip(rec, "compile_graph", "not compiled (--skip-compile / --compile-cases)")
            return
        if not self.cuda:
            self.skip(rec, "compile_graph", "needs CUDA")
            return
        why = self.compile_guard(t0)
        if why:
            self.skip(rec, "compile_graph", why)
            return
        try:
            fn, compile_s = self._compile_and_capture(strong, x, lengths)
        except Exception as e:  # a peer that fails to build is reported, never fatal
            self.skip(rec, "compile_graph", "error: %s" % first_line(e))
            return
        self.measure("compile_graph", fn, ref, True, rec, t0, {"compile_s": compile_s})

    def _compile_and_capture(self, strong, x, lengths):
        """torch.compile (default mode), then one forward captured in a CUDA graph."""
        dynamo_reset()
        tc = time.time()
        fn = torch.compile(strong, dynamic=False)
        with torch.no_grad():
            fn(x, lengths)
            # Warm up on a side stream so lazy kernel autotuning runs before capture.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn(x, lengths)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(x, lengths)
            torch.cuda.synchronize()

        def replay():
            graph.replay()
            return out

        return replay, time.time() - tc

    def compile_autotune(self, c, rec):
        t0 = time.time()
        print("case %d: compile_autotune" % c["case"], flush=True)
        self._autotune_peer(c, rec, t0)
        dynamo_reset()
        free(self.device)
        rec["case_seconds"] = rec.get("case_seconds", 0.0) + time.time() - t0

    def _autotune_peer(self, c, rec, t0):
        model, x, lengths = build_case(c, self.device, self.args.seed)
        ref = reference_subset(model, c, x, lengths, min(c["B"], self.args.check_batch))
        strong = StrongForward(model, c["H"], self.half).to(self.device).eval()
        dynamo_reset()
        try:
            tc = time.time()
            fn = torch.compile(strong, mode="max-autotune-no-cudagraphs", dynamic=False)
            with torch.no_grad():
                for _ in range(2):
                    fn(x, lengths)
            torch.cuda.synchronize()
            compile_s = time.time() - tc
        except Exception as e:  # a peer that fails to build is reported, never fatal
            self.skip(rec, "compile_autotune", "error: %s" % first_line(e))
            return
        self.measure("compile_autotune", lambda: fn(x, lengths), ref, True, rec, t0,
                     {"compile_s": compile_s})


def first_line(e):
    lines = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, lines[0][:200] if lines else "")


def summarise(rec):
    best = None
    for name in ("compile_graph", "compile_autotune"):
        r = rec.get(name)
        if r and r["ok"] and (best is None or r["ms"] < rec[best]["ms"]):
            best = name
    rec["compiled_variant"] = best
    rec["compiled_ms"] = rec[best]["ms"] if best else None
    e = rec.get("eager")
    rec["speedup"] = (e["ms"] / rec["compiled_ms"]) if (best and e and e["ok"]) else None


def fmt_ms(r):
    if not r:
        return "-"
    return "%.3f%s" % (r["ms"], "" if r["ok"] else "!")


def print_table(results):
    hdr = ("case", "B", "S", "D", "H", "F", "c", "eager ms", "sdpa ms", "graph ms",
           "autotune ms", "compiled ms", "x eager", "eager err", "compiled ratio")
    rows = []
    for r in results:
        best = r.get("compiled_variant")
        rows.append((str(r["case"]), str(r["B"]), str(r["S"]), str(r["D"]), str(r["H"]),
                     str(r["F"]), str(r["causal"]), fmt_ms(r.get("eager")),
                     fmt_ms(r.get("sdpa_eager")), fmt_ms(r.get("compile_graph")),
                     fmt_ms(r.get("compile_autotune")),
                     "%.3f" % r["compiled_ms"] if best else "-",
                     "%.1fx" % r["speedup"] if r.get("speedup") else "-",
                     "%.1e" % r["eager"]["max_abs_err"] if r.get("eager") else "-",
                     "%.3f" % r[best]["budget_ratio"] if best else "-"))
    w = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
         for i, h in enumerate(hdr)]
    line = "  ".join(h.rjust(w[i]) for i, h in enumerate(hdr))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(v.rjust(w[i]) for i, v in enumerate(row)))
    print("('!' = failed its accuracy check; 'compiled' = faster passing compiled variant)")


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Time the PyTorch peers of hk on cases.csv.")
    ap.add_argument("--cases", help="cases.csv (default: shared/spec/cases.csv near the repo)")
    ap.add_argument("--cases-only", help="comma-separated case numbers to run (default all)")
    ap.add_argument("--compile-cases", help="cases that get compiled peers (default all run)")
    ap.add_argument("--autotune-cases",
                    help="cases that get compile_autotune, time permitting (default: all "
                         "compiled cases, slowest first)")
    ap.add_argument("--skip-compile", action="store_true", help="eager peers only")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-batch", type=int, default=16,
                    help="sequences checked against the float64 reference (default 16)")
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--max-reps", type=int, default=500)
    ap.add_argument("--target-seconds", type=float, default=1.0,
                    help="timing time per peer per case; reps adapt to it (default 1 s)")
    ap.add_argument("--max-seconds", type=float, default=120.0,
                    help="per case: no new compile starts after this (default 120 s)")
    ap.add_argument("--budget-seconds", type=float, default=300.0,
                    help="whole run: no new compile starts after this (default 300 s)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("peers.py: --device cuda but torch sees no GPU")
    disable_tf32()
    cases, source = load_cases(args.cases)
    only = parse_id_list(args.cases_only, "--cases-only")
    if only is not None:
        unknown = sorted(set(only) - {c["case"] for c in cases})
        if unknown:
            raise SystemExit("peers.py: cases %s not in %s" % (unknown, source))
        cases = [c for c in cases if c["case"] in only]
    compile_ids = parse_id_list(args.compile_cases, "--compile-cases")
    autotune_ids = parse_id_list(args.autotune_cases, "--autotune-cases")
    have_compile = hasattr(torch, "compile")
    cuda = torch.device(device).type == "cuda"
    dev_name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    print("peers: torch %s, %s, cases from %s, TF32 %s"
          % (torch.__version__, dev_name, source, tf32_state()), flush=True)
    if not have_compile and not args.skip_compile:
        print("peers: this torch has no torch.compile: compiled peers skipped", flush=True)

    if hasattr(torch, "_dynamo"):
        # Every case is a new static shape; keep dynamo from giving up on recompiles.
        for knob in ("recompile_limit", "cache_size_limit"):
            try:
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob,
                            max(64, getattr(torch._dynamo.config, knob)))
            except Exception:  # a renamed or removed knob only costs the safety margin
                pass

    runner = Runner(args, device)
    results = []
    for c in cases:
        compile_it = (not args.skip_compile and have_compile
                      and (compile_ids is None or c["case"] in compile_ids))
        results.append(runner.pass1(c, compile_it))

    # Pass 2: max-autotune where time remains, slowest (best pass-1 time) cases first.
    if not args.skip_compile and have_compile and cuda:
        todo = [r for r in results
                if (compile_ids is None or r["case"] in compile_ids)
                and (autotune_ids is None or r["case"] in autotune_ids)]

        def key(r):
            g = r.get("compile_graph") or r.get("sdpa_eager")
            return -(g["ms"] if g else 0.0)

        for r in sorted(todo, key=key):
            c = next(cc for cc in cases if cc["case"] == r["case"])
            g = r.get("compile_graph")
            # An autotuned compile costs a few default compiles: start it only if it fits.
            need = 3.0 * g["compile_s"] + 10.0 if g else 60.0
            if runner.time_left() < need:
                runner.skip(r, "compile_autotune", "run budget left %.0f s < ~%.0f s needed "
                            "(--budget-seconds)" % (max(0.0, runner.time_left()), need))
                continue
            runner.compile_autotune(c, r)
    else:
        for r in results:
            runner.skip(r, "compile_autotune", "not compiled")

    for r in results:
        summarise(r)
    print()
    print_table(results)
    sp = [r["speedup"] for r in results if r.get("speedup")]
    geo = math.exp(sum(math.log(s) for s in sp) / len(sp)) if sp else None
    if geo:
        print("geometric-mean speedup of compiled over eager: %.2fx over %d case(s)"
              % (geo, len(sp)))
    failed = [(r["case"], k) for r in results for k in ("eager", "sdpa_eager", "compile_graph",
                                                        "compile_autotune")
              if r.get(k) and not r[k]["ok"]]
    if failed:
        print("ACCURACY FAILURES: %s" % failed)
    print("total %.0f s" % (time.time() - runner.t_start))

    if args.json:
        doc = {
            "program": "peers.py",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": dev_name,
            "torch": str(torch.__version__),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "tf32": tf32_state(),
            "cases_source": source,
            "settings": {k: v for k, v in vars(args).items() if k != "json"},
            "geomean_speedup": geo,
            "accuracy_failures": failed,
            "total_seconds": time.time() - runner.t_start,
            "cases": results,
        }
        tmp = args.json + ".tmp%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.json)
        print("wrote %s" % args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
