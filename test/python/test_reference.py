#!/usr/bin/env python3
"""Checks apps/hk_reference.py against an independent numpy float64 evaluation of MODEL.md.

The numpy model below is written per head and per row with explicit loops over the softmax,
so it shares no code or vectorisation trick with the torch reference. Covered: lengths 0, 1,
S and in between; causal and bidirectional; non-trivial LayerNorm parameters; float16,
float32 and float64 weights; float16 input; model and input in one file or two; uneven batch
slices; the eps attribute; the --dtype float32 mode; the comparator's pass/fail verdicts and
exit codes; one-line errors on bad files with no output left behind. Sensitivity checks make
sure the comparison would notice a wrong mask, GELU or eps.

Run: /usr/bin/python3 test/python/test_reference.py   (exit status 0 = all checks passed)
"""

import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "apps", "hk_reference.py")

FAILURES = []


def check(name, ok, detail=""):
    print("%-58s %s %s" % (name, "ok  " if ok else "FAIL", detail))
    if not ok:
        FAILURES.append(name)


# ---------------------------------------------------------------------------------------
# Independent numpy model
# ---------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def np_layer_norm(x, w, b, eps):
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        mean = row.sum() / row.size
        var = ((row - mean) ** 2).sum() / row.size
        out[idx] = (row - mean) / math.sqrt(var + eps) * w + b
    return out


def np_model(p, cfg, x, lengths, gelu="erf", causal=None, eps=None):
    """MODEL.md in float64 numpy. gelu/causal/eps overrides exist for sensitivity checks."""
    D, H, L = cfg["d_model"], cfg["n_heads"], cfg["n_layers"]
    causal = cfg["causal"] if causal is None else causal
    eps = cfg["eps"] if eps is None else eps
    hd = D // H
    B, S, _ = x.shape
    x = x.astype(np.float64).copy()

    def lin(t, name):
        return t @ p[name + ".weight"].T + p[name + ".bias"]

    for i in range(L):
        pre = "layers.%d." % i
        h = np_layer_norm(x, p[pre + "norm1.weight"], p[pre + "norm1.bias"], eps)
        q = lin(h, pre + "attn.q_proj")
        k = lin(h, pre + "attn.k_proj")
        v = lin(h, pre + "attn.v_proj")
        o = np.zeros_like(h)
        for b in range(B):
            for head in range(H):
                cols = slice(head * hd, (head + 1) * hd)
                for qi in range(S):
                    keys = [j for j in range(lengths[b]) if not causal or j <= qi]
                    if not keys:
                        continue  # p = 0 for a row with no allowed key
                    s = np.array([q[b, qi, cols] @ k[b, j, cols] for j in keys]) / math.sqrt(hd)
                    e = np.exp(s - s.max())
                    pr = e / e.sum()
                    o[b, qi, cols] = sum(pr[n] * v[b, j, cols] for n, j in enumerate(keys))
        x = x + lin(o, pre + "attn.out_proj")
        h = np_layer_norm(x, p[pre + "norm2.weight"], p[pre + "norm2.bias"], eps)
        z = lin(h, pre + "ffn_in")
        if gelu == "erf":
            g = 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
        else:  # tanh approximation, only to prove the check can tell them apart
            g = 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
        x = x + lin(g, pre + "ffn_out")
    y = np_layer_norm(x, p["final_norm.weight"], p["final_norm.bias"], eps)
    for b in range(B):
        y[b, lengths[b]:, :] = 0.0
    return y


# ---------------------------------------------------------------------------------------
# Writing test files (plain h5py, per FORMAT.md)
# ---------------------------------------------------------------------------------------

def make_params(rng, cfg, wdtype):
    """Random parameters, rounded to the stored type; returns the float64 values stored."""
    D, F, L = cfg["d_model"], cfg["ffn_dim"], cfg["n_layers"]
    p = {}

    def linear(name, out_f, in_f):
        bound = 1.0 / math.sqrt(in_f)
        p[name + ".weight"] = rng.uniform(-bound, bound, (out_f, in_f))
        p[name + ".bias"] = rng.uniform(-bound, bound, (out_f,))

    def norm(name):
        # Non-trivial LayerNorm parameters so a reference ignoring them fails.
        p[name + ".weight"] = 1.0 + 0.5 * rng.standard_normal(D)
        p[name + ".bias"] = 0.3 * rng.standard_normal(D)

    for i in range(L):
        pre = "layers.%d." % i
        norm(pre + "norm1")
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(pre + "attn." + proj, D, D)
        norm(pre + "norm2")
        linear(pre + "ffn_in", F, D)
        linear(pre + "ffn_out", D, F)
    norm("final_norm")
    return {k: v.astype(wdtype).astype(np.float64) for k, v in p.items()}


def write_model(f, cfg, p, wdtype, with_eps):
    g = f.create_group("model")
    g.attrs["format"] = "hk-transformer"
    g.attrs["format_version"] = np.int32(1)
    for k in ("d_model", "n_heads", "n_layers", "ffn_dim"):
        g.attrs[k] = np.int64(cfg[k])
    g.attrs["causal"] = np.int32(1 if cfg["causal"] else 0)
    if with_eps:
        g.attrs["eps"] = np.float64(cfg["eps"])
    for name, v in p.items():
        f.create_dataset("model/" + name.replace(".", "/"), data=v.astype(wdtype))


def write_input(f, x, lengths):
    f.create_dataset("input/x", data=x, chunks=(1,) + x.shape[1:], compression="gzip")
    if lengths is not None:
        f.create_dataset("input/lengths", data=lengths)


def run(args):
    r = subprocess.run([sys.executable, REFERENCE] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    return r.returncode, r.stdout, r.stderr


def read_y(path):
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else str(v))
                 for k, v in f["output"].attrs.items()}
        return f["output/y"][()], f["output/y"].dtype, attrs


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------

CASES = [
    # name, cfg, B, S, lengths (None: absent), weight dtype, x dtype, one file, eps attr, chunk
    ("causal f16 weights, lengths 0/1/S", dict(d_model=16, n_heads=4, n_layers=2, ffn_dim=24,
     causal=True, eps=1e-5), 5, 7, [0, 1, 7, 3, 5], np.float16, np.float32, True, False, 2),
    ("bidirectional f32 weights, f16 x, no lengths, 2 files", dict(d_model=12, n_heads=3,
     n_layers=1, ffn_dim=20, causal=False, eps=1e-5), 3, 6, None, np.float32, np.float16,
     False, True, 0),
    ("bidirectional f64 weights, lengths 0/1/S, eps 1e-3", dict(d_model=8, n_heads=1,
     n_layers=3, ffn_dim=8, causal=False, eps=1e-3), 4, 5, [5, 0, 1, 2], np.float64,
     np.float32, True, True, 3),
    ("causal, head_dim 1, single sequence", dict(d_model=4, n_heads=4, n_layers=1,
     ffn_dim=6, causal=True, eps=1e-5), 1, 9, [6], np.float32, np.float32, True, True, 0),
]


def test_case(tmp, n, case):
    name, cfg, B, S, lengths, wdt, xdt, one_file, with_eps, chunk = case
    rng = np.random.default_rng(1000 + n)
    p = make_params(rng, cfg, wdt)
    x = (1.5 * rng.standard_normal((B, S, cfg["d_model"]))).astype(xdt)
    lens = np.array(lengths if lengths is not None else [S] * B)
    in_path = os.path.join(tmp, "case%d_in.h5" % n)
    model_path = in_path if one_file else os.path.join(tmp, "case%d_model.h5" % n)
    with h5py.File(in_path, "w") as f:
        write_input(f, x, None if lengths is None else np.array(lengths, dtype=np.int32))
        if one_file:
            write_model(f, cfg, p, wdt, with_eps)
    if not one_file:
        with h5py.File(model_path, "w") as f:
            write_model(f, cfg, p, wdt, with_eps)
    out = os.path.join(tmp, "case%d_ref.h5" % n)
    args = ["--input", in_path, "--output", out, "--device", "cpu"]
    if not one_file:
        args += ["--model", model_path]
    if chunk:
        args += ["--batch-chunk", str(chunk)]
    rc, so, se = run(args)
    check("[%s] reference runs" % name, rc == 0, se.strip())
    if rc != 0:
        return
    y, ydt, attrs = read_y(out)
    want = np_model(p, cfg, x.astype(np.float64), lens)
    err = float(np.max(np.abs(y.astype(np.float64) - want)))
    # The file holds float32: allow a few of its rounding steps and nothing more.
    tol = 2e-6 * max(1.0, float(np.abs(want).max()))
    check("[%s] matches numpy float64" % name, err <= tol,
          "max abs err %.2e (tol %.1e)" % (err, tol))
    check("[%s] y is float32 [B,S,D]" % name,
          ydt == np.float32 and y.shape == (B, S, cfg["d_model"]))
    padded = np.concatenate([y[b, lens[b]:].ravel() for b in range(B)])
    check("[%s] padded rows exactly 0, no NaN" % name,
          (padded.size == 0 or not padded.any()) and np.isfinite(y).all(),
          "%d padded elements" % padded.size)
    check("[%s] attributes" % name,
          attrs.get("precision") == "reference-float64" and attrs.get("backend") == "pytorch"
          and attrs.get("program") == "hk_reference.py" and attrs.get("version") == "0.1.0"
          and attrs.get("device") == "cpu", str(sorted(attrs)))
    # Each deliberate model change must move the output well past the float32 tolerance,
    # otherwise the comparison above could not tell it apart.
    valid = np.zeros(y.shape[:2], bool)
    for b in range(B):
        valid[b, :lens[b]] = True
    variants = [("tanh GELU", dict(gelu="tanh")), ("eps x100", dict(eps=cfg["eps"] * 100))]
    if S > 1 and lens.max() > 1:
        variants.append(("flipped causal", dict(causal=not cfg["causal"])))
    for vname, kw in variants:
        alt = np_model(p, cfg, x.astype(np.float64), lens, **kw)
        d = float(np.max(np.abs(alt - want)[valid])) if valid.any() else 0.0
        check("[%s] check notices %s" % (name, vname), d > 3 * tol, "changes y by %.2e" % d)
    return in_path, model_path, out, y


def test_compare(tmp, in_path, ref_path, y):
    def write_out(name, arr):
        path = os.path.join(tmp, name)
        with h5py.File(path, "w") as f:
            f.create_dataset("output/y", data=arr.astype(np.float32))
            f["output"].attrs["precision"] = "fast"
        return path

    good = write_out("out_good.h5", y + 1.5e-3)
    rc, so, se = run(["--compare", good, "--reference", ref_path])
    check("compare: +1.5e-3 everywhere passes (file ref)", rc == 0 and "PASS" in so, se.strip())
    rc, so, se = run(["--compare", good, "--input", in_path, "--device", "cpu"])
    check("compare: +1.5e-3 everywhere passes (computed ref)", rc == 0 and "PASS" in so,
          se.strip())
    rc, so, se = run(["--compare", good, "--reference", ref_path, "--atol", "1e-4",
                      "--rtol", "0"])
    check("compare: same file fails the fp32 budget", rc == 1 and "FAIL" in so)

    bad = y.copy()
    big = np.unravel_index(int(np.argmax(np.abs(y))), y.shape)
    bad[big] *= 1.03  # 3% off where |ref| is largest: over 0.02|ref| and over 2e-3
    badp = write_out("out_bad.h5", bad)
    rc, so, se = run(["--compare", badp, "--reference", ref_path])
    check("compare: one element 3% off fails, exit 1",
          rc == 1 and "violations : 1 of" in so, so.strip().splitlines()[-1] if so else se)

    nan = y.copy()
    nan[0, 0, 0] = np.nan
    nanp = write_out("out_nan.h5", nan)
    rc, so, se = run(["--compare", nanp, "--reference", ref_path])
    check("compare: a NaN fails, exit 1", rc == 1 and "nan / inf  : 1 / 0" in so)

    wrong = write_out("out_shape.h5", y[:, :-1])
    rc, so, se = run(["--compare", wrong, "--reference", ref_path])
    check("compare: shape mismatch is a one-line error, exit 2",
          rc == 2 and len(se.strip().splitlines()) == 1 and "/output/y" in se, se.strip())


def test_float32_mode(tmp, in_path, ref_path):
    out32 = os.path.join(tmp, "ref32.h5")
    rc, so, se = run(["--input", in_path, "--output", out32, "--dtype", "float32",
                      "--device", "cpu"])
    check("--dtype float32 runs", rc == 0, se.strip())
    if rc:
        return
    _, _, attrs = read_y(out32)
    check("--dtype float32 labels itself", attrs.get("precision") == "reference-float32")
    rc, so, se = run(["--compare", out32, "--reference", ref_path, "--atol", "1e-4",
                      "--rtol", "0"])
    check("--dtype float32 within the fp32 budget of float64", rc == 0, so.strip()[-200:])


def test_bad_files(tmp, in_path):
    cfg = dict(d_model=8, n_heads=2, n_layers=1, ffn_dim=8, causal=True, eps=1e-5)
    rng = np.random.default_rng(7)
    p = make_params(rng, cfg, np.float32)
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)

    def build(name, mutate):
        path = os.path.join(tmp, name)
        with h5py.File(path, "w") as f:
            write_model(f, cfg, p, np.float32, True)
            write_input(f, x, np.array([4, 2], np.int32))
            mutate(f)
        return path

    def drop(obj):
        def m(f):
            del f[obj]
        return m

    def set_attr(k, v):
        def m(f):
            f["model"].attrs[k] = v
        return m

    def replace(obj, data):
        def m(f):
            del f[obj]
            f.create_dataset(obj, data=data)
        return m

    bad_cases = [
        ("missing weight", drop("model/layers/0/ffn_in/weight"), "/model/layers/0/ffn_in/weight"),
        ("wrong weight shape", replace("model/layers/0/attn/q_proj/weight",
                                       np.zeros((8, 7), np.float32)), "shape"),
        ("NaN in a weight", replace("model/final_norm/bias",
                                    np.array([np.nan] + [0.0] * 7, np.float32)), "NaN"),
        ("D % H != 0", set_attr("n_heads", np.int32(3)), "multiple"),
        ("wrong format", set_attr("format", "other"), "format"),
        ("length > S", replace("input/lengths", np.array([5, 1], np.int32)), "lengths"),
        ("NaN in x", replace("input/x", np.where(np.arange(64).reshape(2, 4, 8) == 9, np.nan,
                                                 x).astype(np.float32)), "/input/x"),
        ("integer x", replace("input/x", np.zeros((2, 4, 8), np.int32)), "type"),
        ("missing /input", drop("input"), "/input"),
    ]
    for name, mutate, needle in bad_cases:
        path = build("bad_%s.h5" % "".join(c if c.isalnum() else "_" for c in name), mutate)
        out = os.path.join(tmp, "bad_out.h5")
        rc, so, se = run(["--input", path, "--output", out, "--device", "cpu"])
        lines = se.strip().splitlines()
        check("bad file: %s -> one-line error, exit 2" % name,
              rc == 2 and len(lines) == 1 and path in lines[0] and needle in lines[0],
              lines[0] if lines else "(no message)")
        check("bad file: %s -> no output left" % name,
              not os.path.exists(out) and not any(n.startswith(".bad_out.h5.tmp")
                                                  for n in os.listdir(tmp)))


def main():
    with tempfile.TemporaryDirectory(prefix="hk_ref_test_") as tmp:
        first = None
        for n, case in enumerate(CASES):
            r = test_case(tmp, n, case)
            if first is None and r is not None:
                first = r
        if first is not None:
            in_path, _, ref_path, y = first
            test_compare(tmp, in_path, ref_path, y)
            test_float32_mode(tmp, in_path, ref_path)
        test_bad_files(tmp, None)
    print("%d check(s) failed" % len(FAILURES) if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
