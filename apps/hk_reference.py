#!/usr/bin/env python3
"""Float64 reference of the hk transformer forward, and a comparator for hk outputs.

Evaluates the function of spec/MODEL.md written out as plain tensor math (no torch.nn
transformer modules, so the reference does not share code with anything it judges) on files
of the HDF5 contract of spec/FORMAT.md.

  hk_reference.py --input in.h5 [--model model.h5] --output ref.h5
                  [--dtype float64|float32] [--batch-chunk N] [--device cpu|cuda]
  hk_reference.py --compare out.h5 --reference ref.h5        [--atol A --rtol R]
  hk_reference.py --compare out.h5 --input in.h5 [--model m.h5] [--atol A --rtol R]

Exit status: 0 success / budget met, 1 budget violated, 2 bad file or usage.
Works with torch 1.13 and 2.x.
"""

import argparse
import math
import os
import sys

import h5py
import numpy as np
import torch

PROGRAM = "hk_reference.py"
VERSION = "0.1.0"
MODEL_FORMAT = "hk-transformer"
MODEL_FORMAT_VERSION = 1
DEFAULT_EPS = 1e-5

# The seed's budget: |y - ref| <= max(ATOL, RTOL * |ref|).
DEFAULT_ATOL = 2e-3
DEFAULT_RTOL = 0.02


class ContractError(Exception):
    """A file that breaks the HDF5 contract; the message is one line naming file and object."""


class Config:
    def __init__(self, d_model, n_heads, n_layers, ffn_dim, causal, eps):
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.ffn_dim = ffn_dim
        self.causal = causal
        self.eps = eps

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    def __repr__(self):
        return ("Config(D=%d, H=%d, L=%d, F=%d, causal=%d, eps=%g)"
                % (self.d_model, self.n_heads, self.n_layers, self.ffn_dim, int(self.causal),
                   self.eps))


def parameter_shapes(cfg):
    """state_dict name -> shape, per MODEL.md."""
    D, F = cfg.d_model, cfg.ffn_dim
    shapes = {}
    for i in range(cfg.n_layers):
        p = "layers.%d." % i
        shapes[p + "norm1.weight"] = (D,)
        shapes[p + "norm1.bias"] = (D,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[p + "attn.%s.weight" % proj] = (D, D)
            shapes[p + "attn.%s.bias" % proj] = (D,)
        shapes[p + "norm2.weight"] = (D,)
        shapes[p + "norm2.bias"] = (D,)
        shapes[p + "ffn_in.weight"] = (F, D)
        shapes[p + "ffn_in.bias"] = (F,)
        shapes[p + "ffn_out.weight"] = (D, F)
        shapes[p + "ffn_out.bias"] = (D,)
    shapes["final_norm.weight"] = (D,)
    shapes["final_norm.bias"] = (D,)
    return shapes


# ----------------------------------------------------------------------------------------
# The forward of MODEL.md
# ----------------------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    # Biased variance, eps inside the square root.
    mu = x.mean(dim=-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(dim=-1, keepdim=True)
    return xc / torch.sqrt(var + eps) * w + b


def linear(x, w, b):
    # nn.Linear convention: W is [out, in].
    return torch.matmul(x, w.t()) + b


def gelu_erf(z):
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def attention(h, params, prefix, cfg, allowed):
    """Multi-head attention; allowed is bool [b, 1, S, S] (query i, key j)."""
    nb, S, D = h.shape
    H, hd = cfg.n_heads, cfg.head_dim

    def heads(t):
        return t.reshape(nb, S, H, hd).permute(0, 2, 1, 3)

    q = heads(linear(h, params[prefix + "q_proj.weight"], params[prefix + "q_proj.bias"]))
    k = heads(linear(h, params[prefix + "k_proj.weight"], params[prefix + "k_proj.bias"]))
    v = heads(linear(h, params[prefix + "v_proj.weight"], params[prefix + "v_proj.bias"]))
    score = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    score = score.masked_fill(~allowed, float("-inf"))
    # A row with no allowed key has max -inf; shifting it by 0 keeps exp() at exactly 0
    # there, and the guarded denominator then gives p = 0 instead of 0/0.
    m = score.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(score - m)
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    o = torch.matmul(p, v).permute(0, 2, 1, 3).reshape(nb, S, D)
    return linear(o, params[prefix + "out_proj.weight"], params[prefix + "out_proj.bias"])


def forward(params, cfg, x, lengths):
    """y = model(x) per MODEL.md. x [b, S, D] float, lengths int [b] (same device)."""
    nb, S, _ = x.shape
    pos = torch.arange(S, device=x.device)
    valid = pos[None, :] < lengths.to(torch.int64)[:, None]            # [b, S]
    allowed = valid[:, None, None, :]                                   # key mask
    if cfg.causal:
        allowed = allowed & (pos[None, :] <= pos[:, None])[None, None]  # j <= i
    for i in range(cfg.n_layers):
        p = "layers.%d." % i
        h = layer_norm(x, params[p + "norm1.weight"], params[p + "norm1.bias"], cfg.eps)
        x = x + attention(h, params, p + "attn.", cfg, allowed)
        h = layer_norm(x, params[p + "norm2.weight"], params[p + "norm2.bias"], cfg.eps)
        z = gelu_erf(linear(h, params[p + "ffn_in.weight"], params[p + "ffn_in.bias"]))
        x = x + linear(z, params[p + "ffn_out.weight"], params[p + "ffn_out.bias"])
    y = layer_norm(x, params["final_norm.weight"], params["final_norm.bias"], cfg.eps)
    # where(), not a multiply: a padded row must come out 0 whatever it held.
    return torch.where(valid[:, :, None], y, torch.zeros_like(y))


# ----------------------------------------------------------------------------------------
# Reading the HDF5 contract
# ----------------------------------------------------------------------------------------

def _scalar_attr(path, group, name, required=True):
    if name not in group.attrs:
        if required:
            raise ContractError("%s:%s: missing attribute '%s'" % (path, group.name, name))
        return None
    v = group.attrs[name]
    if isinstance(v, (bytes, np.bytes_)):
        return v.decode("utf-8", "replace")
    if isinstance(v, str):
        return v
    a = np.asarray(v)
    if a.size != 1:
        raise ContractError("%s:%s: attribute '%s' must be a scalar, got shape %s"
                            % (path, group.name, name, a.shape))
    a = a.reshape(-1)[0]
    if isinstance(a, (bytes, np.bytes_)):
        return a.decode("utf-8", "replace")
    return a


def _int_attr(path, group, name):
    v = _scalar_attr(path, group, name)
    if isinstance(v, str) or not np.issubdtype(np.asarray(v).dtype, np.integer):
        raise ContractError("%s:%s: attribute '%s' must be an integer, got %r"
                            % (path, group.name, name, v))
    return int(v)


def read_model(path, dtype=torch.float64, device="cpu"):
    """Validate /model of `path` and return (Config, {state_dict name: tensor})."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ContractError("%s: cannot open as HDF5 (%s)" % (path, e))
    with f:
        if "model" not in f or not isinstance(f["model"], h5py.Group):
            raise ContractError("%s:/model: missing group" % path)
        g = f["model"]
        fmt = _scalar_attr(path, g, "format")
        if fmt != MODEL_FORMAT:
            raise ContractError("%s:/model: attribute 'format' is %r, expected %r"
                                % (path, fmt, MODEL_FORMAT))
        ver = _int_attr(path, g, "format_version")
        if ver != MODEL_FORMAT_VERSION:
            raise ContractError("%s:/model: format_version %d, expected %d"
                                % (path, ver, MODEL_FORMAT_VERSION))
        D = _int_attr(path, g, "d_model")
        H = _int_attr(path, g, "n_heads")
        L = _int_attr(path, g, "n_layers")
        F = _int_attr(path, g, "ffn_dim")
        causal = _int_attr(path, g, "causal")
        for name, v in (("d_model", D), ("n_heads", H), ("n_layers", L), ("ffn_dim", F)):
            if v < 1:
                raise ContractError("%s:/model: attribute '%s' = %d, expected >= 1"
                                    % (path, name, v))
        if causal not in (0, 1):
            raise ContractError("%s:/model: attribute 'causal' = %d, expected 0 or 1"
                                % (path, causal))
        if D % H != 0:
            raise ContractError("%s:/model: d_model %d is not a multiple of n_heads %d"
                                % (path, D, H))
        eps = _scalar_attr(path, g, "eps", required=False)
        if eps is None:
            eps = DEFAULT_EPS
        elif isinstance(eps, str) or not np.isfinite(float(eps)) or float(eps) <= 0:
            raise ContractError("%s:/model: attribute 'eps' = %r, expected a positive float"
                                % (path, eps))
        cfg = Config(D, H, L, F, bool(causal), float(eps))
        params = {}
        for name, shape in parameter_shapes(cfg).items():
            obj = "/model/" + name.replace(".", "/")
            if obj not in f or not isinstance(f[obj], h5py.Dataset):
                raise ContractError("%s:%s: missing dataset, expected shape %s"
                                    % (path, obj, list(shape)))
            ds = f[obj]
            if tuple(ds.shape) != shape:
                raise ContractError("%s:%s: shape %s, expected %s"
                                    % (path, obj, list(ds.shape), list(shape)))
            if ds.dtype.kind != "f" or ds.dtype.itemsize not in (2, 4, 8):
                raise ContractError("%s:%s: type %s, expected float16/float32/float64"
                                    % (path, obj, ds.dtype))
            a = ds[()].astype(np.float64)
            if not np.all(np.isfinite(a)):
                raise ContractError("%s:%s: contains NaN or Inf" % (path, obj))
            params[name] = torch.from_numpy(a).to(device=device, dtype=dtype)
    return cfg, params


class InputReader:
    """/input of a file, read one batch slice at a time so big inputs fit in memory."""

    def __init__(self, path, cfg):
        self.path = path
        try:
            self.f = h5py.File(path, "r")
        except OSError as e:
            raise ContractError("%s: cannot open as HDF5 (%s)" % (path, e))
        f = self.f
        if "input" not in f or not isinstance(f["input"], h5py.Group):
            raise ContractError("%s:/input: missing group" % path)
        if "input/x" not in f or not isinstance(f["input/x"], h5py.Dataset):
            raise ContractError("%s:/input/x: missing dataset, expected [B, S, %d]"
                                % (path, cfg.d_model))
        self.x = f["input/x"]
        if self.x.ndim != 3 or self.x.shape[2] != cfg.d_model:
            raise ContractError("%s:/input/x: shape %s, expected [B, S, %d]"
                                % (path, list(self.x.shape), cfg.d_model))
        if self.x.dtype.kind != "f" or self.x.dtype.itemsize not in (2, 4, 8):
            raise ContractError("%s:/input/x: type %s, expected float32 or float16"
                                % (path, self.x.dtype))
        self.B, self.S, self.D = (int(n) for n in self.x.shape)
        if "input/lengths" in f:
            ds = f["input/lengths"]
            if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.shape[0] != self.B:
                raise ContractError("%s:/input/lengths: shape %s, expected [%d]"
                                    % (path, list(getattr(ds, "shape", ())), self.B))
            if ds.dtype.kind not in "iu":
                raise ContractError("%s:/input/lengths: type %s, expected an integer type"
                                    % (path, ds.dtype))
            lengths = ds[()].astype(np.int64)
            bad = np.nonzero((lengths < 0) | (lengths > self.S))[0]
            if bad.size:
                raise ContractError("%s:/input/lengths: lengths[%d] = %d outside 0..%d"
                                    % (path, bad[0], lengths[bad[0]], self.S))
            self.lengths = lengths
        else:
            self.lengths = np.full((self.B,), self.S, dtype=np.int64)

    def read(self, b0, b1):
        x = self.x[b0:b1].astype(np.float32 if self.x.dtype.itemsize <= 4 else np.float64)
        if not np.all(np.isfinite(x)):
            idx = np.argwhere(~np.isfinite(x))[0]
            raise ContractError("%s:/input/x: NaN or Inf at [%d, %d, %d]"
                                % (self.path, b0 + idx[0], idx[1], idx[2]))
        return x, self.lengths[b0:b1]

    def close(self):
        self.f.close()


def auto_batch_chunk(cfg, S, dtype, device):
    """Sequences per slice so one slice's working set stays near a fixed byte budget."""
    elt = torch.finfo(dtype).bits // 8
    # score, exp and probabilities [H, S, S]; FFN [S, F] twice; ~10 [S, D] activations.
    per_seq = elt * (3 * cfg.n_heads * S * S + 2 * S * cfg.ffn_dim + 10 * S * cfg.d_model)
    budget = (4 << 30) if str(device).startswith("cuda") else (1 << 30)
    return max(1, budget // per_seq)


class Reference:
    """The reference evaluation of one (model, input) pair, produced in batch slices."""

    def __init__(self, input_path, model_path, dtype, device, batch_chunk):
        self.cfg, self.params = read_model(model_path, dtype, device)
        self.reader = InputReader(input_path, self.cfg)
        self.dtype = dtype
        self.device = device
        self.shape = (self.reader.B, self.reader.S, self.reader.D)
        self.chunk = batch_chunk or auto_batch_chunk(self.cfg, self.reader.S, dtype, device)

    def slices(self):
        """Yield (b0, b1, y) with y a float64/float32 numpy array [b1-b0, S, D]."""
        B = self.reader.B
        with torch.no_grad():
            for b0 in range(0, B, self.chunk):
                b1 = min(B, b0 + self.chunk)
                xb, lb = self.reader.read(b0, b1)
                x = torch.from_numpy(xb).to(device=self.device, dtype=self.dtype)
                lengths = torch.from_numpy(lb).to(self.device)
                y = forward(self.params, self.cfg, x, lengths)
                yield b0, b1, y.cpu().numpy()

    def close(self):
        self.reader.close()


# ----------------------------------------------------------------------------------------
# Output and comparison
# ----------------------------------------------------------------------------------------

def write_reference(ref, output_path, input_path, model_path):
    B, S, D = ref.shape
    out_dir = os.path.dirname(os.path.abspath(output_path))
    tmp = os.path.join(out_dir, ".%s.tmp%d" % (os.path.basename(output_path), os.getpid()))
    try:
        with h5py.File(tmp, "w") as f:
            g = f.create_group("output")
            y = g.create_dataset("y", shape=(B, S, D), dtype=np.float32)
            for b0, b1, yb in ref.slices():
                y[b0:b1] = yb.astype(np.float32)
            prec = "reference-float64" if ref.dtype == torch.float64 else "reference-float32"
            g.attrs["precision"] = prec
            g.attrs["backend"] = "pytorch"
            g.attrs["device"] = device_name(ref.device)
            g.attrs["program"] = PROGRAM
            g.attrs["version"] = VERSION
            g.attrs["torch_version"] = str(torch.__version__)
            g.attrs["input_file"] = os.path.abspath(input_path)
            g.attrs["model_file"] = os.path.abspath(model_path)
        os.replace(tmp, output_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def device_name(device):
    d = torch.device(device)
    if d.type == "cuda":
        return "cuda:%s" % torch.cuda.get_device_name(d)
    return "cpu"


def open_output_y(path, what):
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ContractError("%s: cannot open as HDF5 (%s)" % (path, e))
    if "output/y" not in f or not isinstance(f["output/y"], h5py.Dataset):
        f.close()
        raise ContractError("%s:/output/y: missing dataset (%s)" % (path, what))
    return f, f["output/y"]


class CompareStats:
    def __init__(self, atol, rtol):
        self.atol, self.rtol = atol, rtol
        self.max_err = 0.0
        self.max_err_at = None
        self.max_ratio = 0.0
        self.max_ratio_at = None
        self.violations = 0
        self.nan = 0
        self.inf = 0
        self.count = 0

    def add(self, b0, y, ref):
        y = y.astype(np.float64)
        ref = ref.astype(np.float64)
        finite = np.isfinite(y)
        self.nan += int(np.isnan(y).sum())
        self.inf += int(np.isinf(y).sum())
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            err = np.where(finite, np.abs(y - ref), np.inf)
            tol = np.maximum(self.atol, self.rtol * np.abs(ref))
            # A non-finite reference value cannot vouch for anything: count it as a violation.
            ratio = np.where(np.isfinite(ref), err / tol, np.inf)
        self.violations += int((ratio > 1.0).sum())
        self.count += y.size
        i = np.unravel_index(int(np.argmax(err)), err.shape)
        if self.max_err_at is None or err[i] > self.max_err:
            self.max_err = float(err[i])
            self.max_err_at = (b0 + int(i[0]), int(i[1]), int(i[2]), float(y[i]), float(ref[i]))
        j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        if self.max_ratio_at is None or ratio[j] > self.max_ratio:
            self.max_ratio = float(ratio[j])
            self.max_ratio_at = (b0 + int(j[0]), int(j[1]), int(j[2]), float(y[j]), float(ref[j]))

    @property
    def ok(self):
        return self.violations == 0 and self.nan == 0 and self.inf == 0

    def report(self, out_path, ref_name, shape, out_attrs):
        def at(t):
            return "at [%d, %d, %d] (y %.6g, ref %.6g)" % t if t else ""
        print("compare    : %s  vs  %s" % (out_path, ref_name))
        if out_attrs:
            print("output     : %s" % ", ".join("%s=%s" % kv for kv in out_attrs))
        print("shape      : [%d, %d, %d]" % shape)
        print("budget     : |y - ref| <= max(%g, %g * |ref|)" % (self.atol, self.rtol))
        print("max abs err: %.3e %s" % (self.max_err, at(self.max_err_at)))
        print("max ratio  : %.4f %s (must be <= 1)" % (self.max_ratio, at(self.max_ratio_at)))
        print("violations : %d of %d" % (self.violations, self.count))
        print("nan / inf  : %d / %d" % (self.nan, self.inf))
        print("result     : %s" % ("PASS" if self.ok else "FAIL"))


def _attr_str(v):
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, np.bytes_)) else str(v)


def run_compare(args, dtype, device):
    fout, yout = open_output_y(args.compare, "the output to check")
    try:
        out_attrs = [(k, _attr_str(fout["output"].attrs[k]))
                     for k in ("precision", "backend", "device", "program", "version")
                     if k in fout["output"].attrs]
        stats = CompareStats(args.atol, args.rtol)
        if args.reference:
            fref, yref = open_output_y(args.reference, "the reference")
            with fref:
                if yref.shape != yout.shape:
                    raise ContractError("%s:/output/y: shape %s, reference %s has %s"
                                        % (args.compare, list(yout.shape), args.reference,
                                           list(yref.shape)))
                B = yout.shape[0]
                per = max(1, (16 << 20) // max(1, yout.shape[1] * yout.shape[2]))
                for b0 in range(0, B, per):
                    b1 = min(B, b0 + per)
                    stats.add(b0, yout[b0:b1], yref[b0:b1])
            ref_name = args.reference
        else:
            ref = Reference(args.input, args.model or args.input, dtype, device,
                            args.batch_chunk)
            try:
                if tuple(yout.shape) != ref.shape:
                    raise ContractError("%s:/output/y: shape %s, expected %s from %s"
                                        % (args.compare, list(yout.shape), list(ref.shape),
                                           args.input))
                for b0, b1, yb in ref.slices():
                    stats.add(b0, yout[b0:b1], yb)
            finally:
                ref.close()
            ref_name = "reference of %s (%s on %s)" % (args.input, str(dtype).split(".")[-1],
                                                        device)
        stats.report(args.compare, ref_name, tuple(yout.shape), out_attrs)
        return 0 if stats.ok else 1
    finally:
        fout.close()


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Float64 PyTorch reference of the hk transformer (spec/MODEL.md) on "
                    "HDF5 files of spec/FORMAT.md, and a budget comparator.")
    ap.add_argument("--input", help="file holding /input (and /model unless --model)")
    ap.add_argument("--model", help="file holding /model (default: the input file)")
    ap.add_argument("--output", help="reference output file to write (/output/y)")
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                    help="arithmetic of the reference (default float64)")
    ap.add_argument("--batch-chunk", type=int, default=0,
                    help="sequences per slice (default: sized to ~1 GiB CPU / 4 GiB GPU)")
    ap.add_argument("--device", default=None,
                    help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--compare", metavar="OUT",
                    help="check OUT's /output/y against --reference, or against the "
                         "reference computed from --input/--model")
    ap.add_argument("--reference", metavar="REF", help="reference output file for --compare")
    ap.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                    help="absolute budget (default 2e-3; fp32 mode: 1e-4 with --rtol 0)")
    ap.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                    help="relative budget (default 0.02)")
    args = ap.parse_args(argv)
    if args.batch_chunk < 0:
        ap.error("--batch-chunk must be >= 0")
    if args.compare:
        if bool(args.reference) == bool(args.input):
            ap.error("--compare needs exactly one of --reference or --input")
        if args.output:
            ap.error("--compare does not write a file; drop --output")
    else:
        if not args.input or not args.output:
            ap.error("--input and --output are required (or use --compare)")
        same = [p for p in (args.input, args.model) if p and os.path.exists(p)
                and os.path.exists(args.output) and os.path.samefile(p, args.output)]
        if same:
            ap.error("--output must not be the input or model file")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if args.compare:
            return run_compare(args, dtype, device)
        ref = Reference(args.input, args.model or args.input, dtype, device, args.batch_chunk)
        try:
            write_reference(ref, args.output, args.input, args.model or args.input)
        finally:
            ref.close()
        B, S, D = ref.shape
        print("%s: wrote %s: /output/y [%d, %d, %d], %s, %s on %s"
              % (PROGRAM, args.output, B, S, D, ref.cfg, args.dtype, device_name(device)))
        return 0
    except ContractError as e:
        print("%s: error: %s" % (PROGRAM, e), file=sys.stderr)
        return 2
    except OSError as e:  # e.g. an unwritable output directory
        print("%s: error: %s" % (PROGRAM, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
