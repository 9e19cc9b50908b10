#!/usr/bin/env python3
"""PyTorch as an oracle for torchlean's ops: one op per graph file, run by `torchlean run-graph
--grad` under several profiles, its values and gradients compared with PyTorch's (computed in
float64 from the same float32 inputs; the special-value cases in float32, so that overflow
means what it means in f32). Shapes cover broadcasting, empty and scalar tensors, long
reductions, strided and tiled kernel paths (large sizes), and NaN / ±inf / ±0 / subnormal
inputs.

    python3 -m venv .oracle-venv && .oracle-venv/bin/pip install torch numpy
    .oracle-venv/bin/python scripts/pytorch-oracle.py [--torchlean target/release/torchlean] [--profiles checked_cuda,strict_native_cuda]

Prints every disagreement (op, profile, where, both values) and exits 1 if there is one.
"""
import json, os, struct, subprocess, sys, itertools
import numpy as np, torch
import argparse, concurrent.futures, shlex, shutil, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import write_st, read_st, close
ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
ap.add_argument("--torchlean", default="target/release/torchlean")
ap.add_argument("--jobs", type=int, default=2, help="run-graph processes at once")
ap.add_argument("--extra", default="", help="arguments added to every run-graph command (e.g. '--provider prefer:native_cuda')")
ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0, the recorded runs'; another draws other values of the same cases)")
ap.add_argument("--profiles", default=None, help="comma-separated profiles for every case (e.g. checked_cuda,strict_native_cuda); default: each case's CPU profiles")
ARGS = ap.parse_args()
BIN = ARGS.torchlean
WORK = tempfile.mkdtemp(prefix="torchlean-oracle-")
rng = np.random.default_rng(ARGS.seed)

def run(op, xs, c, profile, grad=True):
    out_shape = c.shape
    work = tempfile.mkdtemp(dir=WORK)
    names = [f"x{i}" for i in range(len(xs))]
    nodes = [{"id": i, "kind": "input", "name": nm, "parents": [], "shape": list(x.shape), "dtype": "f32"} for i, (nm, x) in enumerate(zip(names, xs))]
    k = len(xs)
    nodes.append({"id": k, "kind": "op", "op": op, "parents": list(range(k)), "shape": list(out_shape), "dtype": "f32"})
    nodes.append({"id": k + 1, "kind": "input", "name": "c", "parents": [], "shape": list(out_shape), "dtype": "f32"})
    nodes.append({"id": k + 2, "kind": "op", "op": {"op": "mul"}, "parents": [k, k + 1], "shape": list(out_shape), "dtype": "f32"})
    nodes.append({"id": k + 3, "kind": "op", "op": {"op": "sum_all"}, "parents": [k + 2], "shape": [], "dtype": "f32"})
    g = {"format": "torchlean.ir.v1", "inputs": [{"name": nm, "shape": list(x.shape)} for nm, x in zip(names, xs)] + [{"name": "c", "shape": list(out_shape)}],
         "parameters": [], "nodes": nodes, "outputs": [{"name": "y", "node": k}, {"name": "loss", "node": k + 3}]}
    json.dump(g, open(f"{work}/g.json", "w"))
    write_st(f"{work}/in.st", dict(zip(names + ["c"], list(xs) + [c])))
    cmd = [BIN, "run-graph", f"{work}/g.json", "--inputs", f"{work}/in.st", "--out", f"{work}/out.st", "--profile", profile] + shlex.split(ARGS.extra) + (["--grad"] if grad else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[-400:]
    out = read_st(f"{work}/out.st")
    shutil.rmtree(work, ignore_errors=True)
    return out, None

FAILS = []
def fail(*f):
    FAILS.append(f)
    print("disagreement:", " | ".join(f)[:600], flush=True)
POOL = concurrent.futures.ThreadPoolExecutor(max_workers=ARGS.jobs)
JOBS = []
def check(label, op, xs, tfn, profiles=("checked_cpu", "strict_cpu", "strict_native_cpu"), diff=None, rtol=1e-4, atol=2e-5, grad=True):
    """Queues the case on every profile; PyTorch's values and gradients are computed here."""
    profiles = ARGS.profiles.split(",") if ARGS.profiles else profiles
    # special values against PyTorch's f32 (overflow as in f32), except GELU: PyTorch's f32
    # kernel gives NaN at +inf where its f64 one (and the formula in IEEE arithmetic) gives +inf
    dt = torch.float32 if "special" in label and not label.startswith("gelu") else torch.float64
    ts = [torch.tensor(x, dtype=dt, requires_grad=(diff is None or i in diff)) for i, x in enumerate(xs)]
    y = tfn(*ts)
    for prof in profiles:
        c = rng.standard_normal(tuple(y.shape)).astype(np.float32)
        grads = {}
        if grad:
            for t in ts: t.grad = None
            (y * torch.tensor(c, dtype=y.dtype)).sum().backward(retain_graph=True)
            grads = {f"grad.x{i}": (t.grad.numpy().copy() if t.grad is not None else np.zeros(t.shape))
                     for i, t in enumerate(ts) if t.requires_grad}
        JOBS.append(POOL.submit(compare_run, label, op, xs, c, prof, y.detach().numpy().copy(), grads, grad, rtol, atol))

def compare_run(label, op, xs, c, prof, want_y, grads, grad, rtol, atol):
    out, err = run(op, xs, c, prof, grad)
    if err:
        fail(label, prof, "refused/failed: " + err.replace("\n", " | "))
        return
    msg = close(out["y"], want_y, rtol, atol)
    if msg:
        fail(label, prof, "forward " + msg)
        return
    for key, want in grads.items():
        if key not in out:
            fail(label, prof, f"no {key} in output ({list(out)})")
            continue
        msg = close(out[key], want, rtol * 5, atol * 5)
        if msg:
            fail(label, prof, f"{key} " + msg)

def randn(*s, lo=None):
    a = rng.standard_normal(s).astype(np.float32)
    if lo is not None: a = np.abs(a) + lo
    return a


import torch.nn.functional as F
T = torch

# ---- small shapes, broadcasting, special values, every profile ----
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 1e-40, -3.5, 2.5], np.float32)
def spec_mix(*s):
    a = randn(*s); flat = a.reshape(-1); flat[:len(SPECIAL)] = SPECIAL[:flat.size]; return a

unary = {"neg": T.neg, "abs": T.abs, "sqrt": T.sqrt, "exp": T.exp, "log": T.log, "sin": T.sin, "cos": T.cos, "tanh": T.tanh,
         "sigmoid": T.sigmoid, "relu": T.relu, "gelu": F.gelu, "silu": F.silu, "softplus": F.softplus, "erf": T.erf, "atan": T.atan, "sinh": T.sinh, "cosh": T.cosh, "asinh": T.asinh, "inv": T.reciprocal}
for name, f in unary.items():
    pos = name in ("sqrt", "log")
    check(name, {"op": name}, [randn(5, 7, lo=0.1) if pos else randn(5, 7) * 3], f)
    check(name + "/special", {"op": name}, [spec_mix(3, 5)], f, grad=False)
    check(name + "/big", {"op": name}, [randn(300, 257, lo=0.1) if pos else randn(300, 257) * 3], f)
for name, f in {"tan": T.tan, "asin": T.asin, "acos": T.acos, "atanh": T.atanh}.items():  # inside the domains
    check(name, {"op": name}, [np.asarray(rng.uniform(-0.9, 0.9, (5, 7)), np.float32)], f)
    check(name + "/special", {"op": name}, [spec_mix(3, 5)], f, grad=False)
check("acosh", {"op": "acosh"}, [np.asarray(rng.uniform(1.1, 3.0, (5, 7)), np.float32)], T.acosh)
check("acosh/special", {"op": "acosh"}, [spec_mix(3, 5)], T.acosh, grad=False)
check("safe_log", {"op": "safe_log", "eps": 1e-3}, [randn(4, 6)], lambda x: T.log(T.clamp(x, min=1e-3)))
check("scale", {"op": "scale", "factor": -2.5}, [randn(4, 6)], lambda x: x * np.float32(-2.5))
check("add_scalar", {"op": "add_scalar", "value": 1.5}, [randn(4, 6)], lambda x: x + 1.5)
check("clamp", {"op": "clamp", "min": -0.5, "max": 0.7}, [randn(40, 6)], lambda x: T.clamp(x, -0.5, 0.7))
check("clamp/special", {"op": "clamp", "min": -0.5, "max": 0.7}, [spec_mix(4, 6)], lambda x: T.clamp(x, -0.5, 0.7), grad=False)
for e in (2.0, 3.0, 0.5, -1.0, 1.7, 0.0):
    check(f"pow{e}", {"op": "pow", "exponent": e}, [randn(5, 6, lo=0.2)], lambda x, e=e: T.pow(x, e))
    check(f"pow{e}/neg", {"op": "pow", "exponent": e}, [randn(5, 6)], lambda x, e=e: T.pow(x, e), grad=(e in (2.0, 3.0)))
bins = {"add": T.add, "sub": T.sub, "mul": T.mul, "div": T.div, "maximum": T.maximum, "minimum": T.minimum}
for name, f in bins.items():
    for sa, sb in [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((2, 3, 4), (2, 1, 4)), ((), (3, 2))]:
        b = randn(*sb) if name != "div" else randn(*sb, lo=0.5)
        check(f"{name}{sa}{sb}", {"op": name}, [randn(*sa), b], f)
    check(name + "/special", {"op": name}, [spec_mix(2, 5), spec_mix(2, 5)[::-1].copy()], f, grad=False)
check("where", {"op": "where"}, [(randn(4, 5) > 0).astype(np.float32), randn(4, 5), randn(1, 5)], lambda c, a, b: T.where(c != 0, a, b), diff={1, 2})
for ax in (0, 1, 2):
    check(f"softmax{ax}", {"op": "softmax", "axis": ax}, [randn(3, 4, 5) * 4], lambda x, ax=ax: T.softmax(x, ax))
    check(f"log_softmax{ax}", {"op": "log_softmax", "axis": ax}, [randn(3, 4, 5) * 4], lambda x, ax=ax: T.log_softmax(x, ax))
check("softmax/-inf", {"op": "softmax", "axis": 1}, [np.array([[-np.inf, 0, 1], [-np.inf, -np.inf, 2], [1e30, 1e30, 0]], np.float32)], lambda x: T.softmax(x, 1))
check("log_softmax/-inf", {"op": "log_softmax", "axis": 1}, [np.array([[-np.inf, 0, 1], [-np.inf, -np.inf, 2]], np.float32)], lambda x: T.log_softmax(x, 1), grad=False)
check("sum_all", {"op": "sum_all"}, [randn(7, 9)], lambda x: x.sum())
# (empty `axes` is refused by design: sum_all reduces everything)
for axes, kd in [([0], False), ([1], True), ([0, 2], False), ([2, 0], True)]:
    check(f"reduce_sum{axes}{kd}", {"op": "reduce_sum", "axes": axes, "keepdim": kd}, [randn(3, 4, 5)], lambda x, a=axes, k=kd: x.sum(dim=tuple(a), keepdim=k) if a else x.sum(dim=(), keepdim=k))
    check(f"reduce_mean{axes}{kd}", {"op": "reduce_mean", "axes": axes, "keepdim": kd}, [randn(3, 4, 5)], lambda x, a=axes, k=kd: x.mean(dim=tuple(a), keepdim=k) if a else x.mean(dim=(), keepdim=k))
check("argmax", {"op": "argmax", "axis": 1}, [randn(4, 6)], lambda x: T.argmax(x, 1).double(), grad=False)
check("argmax/nan", {"op": "argmax", "axis": 1}, [np.array([[1, np.nan, 3], [2, 2, 1], [-np.inf, -np.inf, -np.inf]], np.float32)], lambda x: T.argmax(x, 1).double(), grad=False)
check("reshape", {"op": "reshape", "shape": [6, 4]}, [randn(2, 3, 4)], lambda x: x.reshape(6, 4))
check("permute", {"op": "permute", "axes": [2, 0, 1]}, [randn(2, 3, 4)], lambda x: x.permute(2, 0, 1))
check("broadcast_to", {"op": "broadcast_to", "shape": [2, 3, 4]}, [randn(3, 1)], lambda x: x.broadcast_to(2, 3, 4))
check("concat", {"op": "concat", "axis": 1}, [randn(2, 3), randn(2, 5)], lambda a, b: T.cat([a, b], 1))
check("slice", {"op": "slice", "axis": 1, "start": 1, "end": 4}, [randn(3, 6)], lambda x: x[:, 1:4])
idx = np.array([2, 0, 2, 1], np.float32)
check("index_select", {"op": "index_select", "axis": 0}, [randn(3, 4), idx], lambda x, i: T.index_select(x, 0, i.long()), diff={0})
gi = rng.integers(0, 4, (3, 5)).astype(np.float32)
check("gather", {"op": "gather", "axis": 1}, [randn(3, 4), gi], lambda x, i: T.gather(x, 1, i.long()), diff={0})
si = rng.integers(0, 4, (3, 5)).astype(np.float32)
check("scatter_add", {"op": "scatter_add", "axis": 1}, [randn(3, 4), si, randn(3, 5)], lambda x, i, s: x.scatter_add(1, i.long(), s), diff={0, 2})
# (1-D operands are refused by design: the op is [..., m, k] @ [..., k, n])
for sa, sb in [((4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3)), ((2, 4, 5), (5, 3)), ((4, 5), (2, 5, 3)), ((40, 50), (50, 30))]:
    check(f"matmul{sa}{sb}", {"op": "matmul"}, [randn(*sa), randn(*sb)], T.matmul)
check("linear", {"op": "linear"}, [randn(2, 3, 5), randn(4, 5), randn(4)], F.linear)
check("linear/nobias", {"op": "linear"}, [randn(3, 5), randn(4, 5)], F.linear)
check("linear/1d", {"op": "linear"}, [randn(5), randn(4, 5), randn(4)], F.linear)
check("mse_loss", {"op": "mse_loss"}, [randn(4, 5), randn(4, 5)], F.mse_loss)
check("layer_norm", {"op": "layer_norm", "eps": 1e-5}, [randn(3, 4, 6), randn(6), randn(6)], lambda x, g, b: F.layer_norm(x, (6,), g, b, 1e-5))
check("rms_norm", {"op": "rms_norm", "eps": 1e-5}, [randn(3, 6), randn(6)], lambda x, g: F.rms_norm(x, (6,), g, 1e-5))
check("batch_norm", {"op": "batch_norm", "eps": 1e-5, "channel_axis": 1}, [randn(4, 3, 5, 2), randn(3), randn(3)], lambda x, g, b: F.batch_norm(x, None, None, g, b, True, 0.1, 1e-5))
check("batch_norm2d", {"op": "batch_norm", "eps": 1e-5, "channel_axis": 1}, [randn(6, 3), randn(3), randn(3)], lambda x, g, b: F.batch_norm(x, None, None, g, b, True, 0.1, 1e-5))
for (st, pd, dl, gr) in [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 1), 1), ((1, 1), (1, 1), (2, 2), 1), ((2, 2), (1, 0), (1, 1), 2)]:
    cin, cout = 4, 6
    check(f"conv2d{st}{pd}{dl}{gr}", {"op": "conv2d", "stride": list(st), "padding": list(pd), "dilation": list(dl), "groups": gr},
          [randn(2, cin, 7, 8), randn(cout, cin // gr, 3, 2), randn(cout)], lambda x, w, b, st=st, pd=pd, dl=dl, gr=gr: F.conv2d(x, w, b, st, pd, dl, gr))
    check(f"conv2d/nobias{st}", {"op": "conv2d", "stride": list(st), "padding": list(pd), "dilation": list(dl), "groups": gr},
          [randn(2, cin, 7, 8), randn(cout, cin // gr, 3, 3)], lambda x, w, st=st, pd=pd, dl=dl, gr=gr: F.conv2d(x, w, None, st, pd, dl, gr))
for (st, pd, op_, dl, gr) in [((1, 1), (0, 0), (0, 0), (1, 1), 1), ((2, 2), (1, 0), (1, 1), (1, 1), 1), ((2, 1), (0, 1), (0, 0), (2, 1), 2)]:
    check(f"conv_t{st}{pd}{op_}{dl}{gr}", {"op": "conv_transpose2d", "stride": list(st), "padding": list(pd), "output_padding": list(op_), "dilation": list(dl), "groups": gr},
          [randn(2, 4, 5, 6), randn(4, 6 // gr, 3, 2), randn(6)], lambda x, w, b, st=st, pd=pd, op_=op_, dl=dl, gr=gr: F.conv_transpose2d(x, w, b, st, pd, op_, gr, dl))
for (k, st, pd) in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 1), (1, 1)), ((3, 2), (1, 2), (1, 0))]:
    check(f"max_pool{k}{st}{pd}", {"op": "max_pool2d", "kernel": list(k), "stride": list(st), "padding": list(pd)}, [randn(2, 3, 7, 8)], lambda x, k=k, st=st, pd=pd: F.max_pool2d(x, k, st, pd))
    for cip in (True, False):
        check(f"avg_pool{k}{st}{pd}{cip}", {"op": "avg_pool2d", "geometry": {"kernel": list(k), "stride": list(st), "padding": list(pd)}, "count_include_pad": cip}, [randn(2, 3, 7, 8)], lambda x, k=k, st=st, pd=pd, cip=cip: F.avg_pool2d(x, k, st, pd, count_include_pad=cip))
check("max_pool/nan", {"op": "max_pool2d", "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, [spec_mix(1, 2, 4, 4)], lambda x: F.max_pool2d(x, 2, 2), grad=False)
for causal in (False, True):
    for L, S in [(5, 5), (4, 7), (7, 4)]:
        q, k, v = randn(2, 3, L, 8), randn(2, 3, S, 8), randn(2, 3, S, 6)
        check(f"sdpa L{L} S{S} causal={causal}", {"op": "scaled_dot_product_attention", "scale": None, "causal": causal, "mask": "none"}, [q, k, v],
              lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c))
    # a graph node takes [L, S] or the full mask (the Tensor API broadcasts others first)
    m = np.broadcast_to((rng.random((2, 1, 5, 5)) > 0.3).astype(np.float32), (2, 3, 5, 5)).copy()
    check(f"sdpa bool mask causal={causal}", {"op": "scaled_dot_product_attention", "scale": 0.3, "causal": causal, "mask": "boolean"}, [randn(2, 3, 5, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 4), m],
          lambda q, k, v, m, c=causal: F.scaled_dot_product_attention(q, k, v, attn_mask=(m != 0) & (T.ones(5, 5, dtype=T.bool).tril() if c else True), scale=0.3), diff={0, 1, 2})
    bias = randn(5, 5)
    check(f"sdpa additive causal={causal}", {"op": "scaled_dot_product_attention", "scale": None, "causal": causal, "mask": "additive_bias"}, [randn(2, 3, 5, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 4), bias],
          lambda q, k, v, b, c=causal: F.scaled_dot_product_attention(q, k, v, attn_mask=b + (T.zeros(5, 5).masked_fill(~T.ones(5, 5, dtype=T.bool).tril(), -float('inf')) if c else 0)))

# ---- large shapes (SIMD, parallel and tiled paths) ----
def spec_big(*s, frac=0.01):
    a = randn(*s) * 3; flat = a.reshape(-1)
    n = flat.size; pos = rng.choice(n, max(1, int(n * frac)), replace=False)
    flat[pos] = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32), len(pos)); return a
P = ("checked_cpu", "strict_native_cpu")
# elementwise big, with specials (SIMD / parallel / tiled paths)
for name, f in {"relu": T.relu, "gelu": F.gelu, "tanh": T.tanh, "sigmoid": T.sigmoid, "exp": T.exp, "abs": T.abs, "softplus": F.softplus, "erf": T.erf, "silu": F.silu, "neg": T.neg}.items():
    check(name + "/bigspecial", {"op": name}, [spec_big(256, 300)], f, profiles=P, grad=False)
for name, f in {"add": T.add, "mul": T.mul, "maximum": T.maximum, "minimum": T.minimum, "sub": T.sub, "div": T.div}.items():
    check(name + "/bigbcast", {"op": name}, [randn(64, 32, 40), randn(32, 1)], f, profiles=P)
    check(name + "/bigbcast2", {"op": name}, [randn(64, 1, 40), randn(32, 40)], f, profiles=P)
    check(name + "/bigspecial", {"op": name}, [spec_big(200, 300), spec_big(200, 300)], f, profiles=P, grad=False)
for ax in (1, 2):
    check(f"softmax/big{ax}", {"op": "softmax", "axis": ax}, [randn(8, 130, 257) * 5], lambda x, ax=ax: T.softmax(x, ax), profiles=P)
    check(f"log_softmax/big{ax}", {"op": "log_softmax", "axis": ax}, [randn(8, 130, 257) * 5], lambda x, ax=ax: T.log_softmax(x, ax), profiles=P)
check("softmax/bigspecial", {"op": "softmax", "axis": 1}, [spec_big(64, 300, frac=0.002)], lambda x: T.softmax(x, 1), profiles=P, grad=False)
check("layer_norm/big", {"op": "layer_norm", "eps": 1e-5}, [randn(64, 40, 96) * 3 + 5, randn(96), randn(96)], lambda x, g, b: F.layer_norm(x, (96,), g, b, 1e-5), profiles=P)
check("layer_norm/special", {"op": "layer_norm", "eps": 1e-5}, [spec_big(16, 33, frac=0.05), randn(33), randn(33)], lambda x, g, b: F.layer_norm(x, (33,), g, b, 1e-5), profiles=P, grad=False)
check("rms_norm/big", {"op": "rms_norm", "eps": 1e-6}, [randn(64, 40, 96), randn(96)], lambda x, g: F.rms_norm(x, (96,), g, 1e-6), profiles=P)
check("batch_norm/big", {"op": "batch_norm", "eps": 1e-5, "channel_axis": 1}, [randn(32, 8, 16, 16) * 2 + 1, randn(8), randn(8)], lambda x, g, b: F.batch_norm(x, None, None, g, b, True, 0.1, 1e-5), profiles=P)
for (st, pd, dl, gr, cin, cout, k) in [((1, 1), (1, 1), (1, 1), 1, 1, 8, 3), ((1, 1), (1, 1), (1, 1), 1, 8, 16, 3), ((1, 1), (2, 2), (1, 1), 1, 3, 16, 5), ((2, 2), (1, 1), (1, 1), 1, 16, 32, 3), ((1, 1), (0, 0), (1, 1), 4, 16, 16, 1), ((1, 1), (1, 1), (2, 2), 2, 8, 8, 3)]:
    check(f"conv/big{st}{pd}{dl}{gr}{cin}{cout}{k}", {"op": "conv2d", "stride": list(st), "padding": list(pd), "dilation": list(dl), "groups": gr},
          [randn(8, cin, 16, 16), randn(cout, cin // gr, k, k) * 0.3, randn(cout)], lambda x, w, b, st=st, pd=pd, dl=dl, gr=gr: F.conv2d(x, w, b, st, pd, dl, gr), profiles=P)
check("conv/bigspecial", {"op": "conv2d", "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1},
      [spec_big(4, 8, 16, 16, frac=0.002), randn(16, 8, 3, 3), randn(16)], lambda x, w, b: F.conv2d(x, w, b, 1, 1), profiles=P, grad=False)
check("maxpool2x2/bigspecial", {"op": "max_pool2d", "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, [spec_big(16, 8, 16, 16)], lambda x: F.max_pool2d(x, 2, 2), profiles=P, grad=False)
check("maxpool2x2/big", {"op": "max_pool2d", "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, [randn(16, 8, 16, 16)], lambda x: F.max_pool2d(x, 2, 2), profiles=P)
check("avgpool2x2/big", {"op": "avg_pool2d", "geometry": {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, "count_include_pad": True}, [randn(16, 8, 16, 16)], lambda x: F.avg_pool2d(x, 2, 2), profiles=P)
check("avgpool2x2/bigspecial", {"op": "avg_pool2d", "geometry": {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, "count_include_pad": True}, [spec_big(16, 8, 16, 16)], lambda x: F.avg_pool2d(x, 2, 2), profiles=P, grad=False)
for sa, sb in [((128, 300), (300, 200)), ((4, 64, 96), (4, 96, 80)), ((4, 64, 96), (96, 80))]:
    check(f"matmul/big{sa}{sb}", {"op": "matmul"}, [randn(*sa), randn(*sb)], T.matmul, profiles=P, rtol=3e-4)
check("linear/big", {"op": "linear"}, [randn(8, 64, 300), randn(200, 300), randn(200)], F.linear, profiles=P, rtol=3e-4)
check("matmul/special", {"op": "matmul"}, [spec_big(32, 40, frac=0.003), randn(40, 24)], T.matmul, profiles=P, grad=False)
for causal in (False, True):
    for B, H, L, S, D in [(2, 4, 64, 64, 32), (1, 2, 130, 70, 16), (2, 2, 70, 200, 64), (1, 1, 1, 300, 8)]:
        q, k, v = randn(B, H, L, D), randn(B, H, S, D), randn(B, H, S, D)
        check(f"sdpa/big {B,H,L,S,D} causal={causal}", {"op": "scaled_dot_product_attention", "scale": None, "causal": causal, "mask": "none"}, [q, k, v],
              lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c), profiles=P, rtol=3e-4)
    m = (rng.random((2, 2, 70, 90)) > 0.5).astype(np.float32); m[0, 0, 3, :] = 0
    check(f"sdpa/big mask causal={causal}", {"op": "scaled_dot_product_attention", "scale": None, "causal": causal, "mask": "boolean"}, [randn(2, 2, 70, 16), randn(2, 2, 90, 16), randn(2, 2, 90, 16), m],
          lambda q, k, v, m, c=causal: T.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=(m != 0) & (T.ones(70, 90, dtype=T.bool).tril() if c else True)), nan=0.0), diff={0, 1, 2}, profiles=P, rtol=3e-4)

# ---- empty, scalar, long reductions, odd geometry ----
P = ("checked_cpu", "strict_native_cpu", "strict_cpu")
# empty tensors
check("relu/empty", {"op": "relu"}, [randn(0, 5)], T.relu, profiles=P)
check("add/empty", {"op": "add"}, [randn(0, 5), randn(5)], T.add, profiles=P)
check("matmul/emptyk", {"op": "matmul"}, [randn(3, 0), randn(0, 4)], T.matmul, profiles=P)
check("matmul/emptym", {"op": "matmul"}, [randn(0, 3), randn(3, 4)], T.matmul, profiles=P)
check("softmax/empty", {"op": "softmax", "axis": 1}, [randn(0, 5)], lambda x: T.softmax(x, 1), profiles=P)
check("sum_all/empty", {"op": "sum_all"}, [randn(0, 5)], lambda x: x.sum(), profiles=P)
check("reduce_mean/empty", {"op": "reduce_mean", "axes": [0], "keepdim": False}, [randn(0, 5)], lambda x: x.mean(0), profiles=P, grad=False)
check("layer_norm/empty", {"op": "layer_norm", "eps": 1e-5}, [randn(0, 6), randn(6), randn(6)], lambda x, g, b: F.layer_norm(x, (6,), g, b), profiles=P)
check("linear/empty", {"op": "linear"}, [randn(0, 5), randn(4, 5), randn(4)], F.linear, profiles=P)
check("concat/empty", {"op": "concat", "axis": 0}, [randn(0, 3), randn(2, 3)], lambda a, b: T.cat([a, b]), profiles=P)
check("slice/empty", {"op": "slice", "axis": 1, "start": 2, "end": 2}, [randn(3, 4)], lambda x: x[:, 2:2], profiles=P)
# scalars
check("relu/scalar", {"op": "relu"}, [np.array(-1.5, np.float32)], T.relu, profiles=P)
check("mul/scalar", {"op": "mul"}, [np.array(2.0, np.float32), randn(3)], T.mul, profiles=P)
# precision of long reductions
x = (rng.standard_normal(1 << 20) + 100).astype(np.float32)
check("sum_all/1M", {"op": "sum_all"}, [x], lambda x: x.sum(), profiles=P, rtol=1e-6, atol=1e-9)
check("reduce_mean/long", {"op": "reduce_mean", "axes": [1], "keepdim": False}, [x.reshape(4, -1)], lambda x: x.mean(1), profiles=P, rtol=1e-6, atol=1e-9)
# the same precision over the other paths a long sum takes: a middle axis, every axis, a
# wide softmax's normalizer, batch statistics over N·H·W, and one row of 4M terms
xm = (rng.standard_normal((4, 1 << 16, 4)) + 100).astype(np.float32)
check("reduce_mean/long-middle", {"op": "reduce_mean", "axes": [1], "keepdim": False}, [xm], lambda x: x.mean(1), profiles=P, rtol=1e-6, atol=1e-9)
check("reduce_sum/long-all", {"op": "reduce_sum", "axes": [0, 1, 2], "keepdim": False}, [xm], lambda x: x.sum((0, 1, 2)), profiles=P, rtol=1e-6, atol=1e-9)
check("reduce_mean/4M-row", {"op": "reduce_mean", "axes": [1], "keepdim": True}, [(rng.standard_normal((1, 1 << 22)) + 100).astype(np.float32)], lambda x: x.mean(1, keepdim=True), profiles=("checked_cpu",), rtol=1e-6, atol=1e-9, grad=False)
check("softmax/wide-offset", {"op": "softmax", "axis": 1}, [(rng.standard_normal((2, 1 << 18)) * 0.01).astype(np.float32)], lambda x: T.softmax(x, 1), profiles=P, rtol=1e-5, atol=1e-12, grad=False)
check("log_softmax/wide-offset", {"op": "log_softmax", "axis": 1}, [(rng.standard_normal((2, 1 << 18)) * 0.01).astype(np.float32)], lambda x: T.log_softmax(x, 1), profiles=P, rtol=1e-6, atol=1e-9, grad=False)
check("layer_norm/wide-offset", {"op": "layer_norm", "eps": 1e-5}, [(randn(2, 1 << 16) + 100).astype(np.float32), randn(1 << 16), randn(1 << 16)], lambda x, g, b: F.layer_norm(x, (1 << 16,), g, b), profiles=P, grad=False)
check("batch_norm/offset", {"op": "batch_norm", "eps": 1e-5, "channel_axis": 1}, [(randn(64, 4, 32, 32) + 100).astype(np.float32), randn(4), randn(4)], lambda x, g, b: F.batch_norm(x, None, None, g, b, True, 0.1, 1e-5), profiles=P, grad=False)
check("layer_norm/offset", {"op": "layer_norm", "eps": 1e-5}, [(randn(8, 512) + 1000).astype(np.float32), randn(512), randn(512)], lambda x, g, b: F.layer_norm(x, (512,), g, b), profiles=P)
check("softmax/wide", {"op": "softmax", "axis": 1}, [randn(4, 100000) * 10], lambda x: T.softmax(x, 1), profiles=P)
check("mse/big", {"op": "mse_loss"}, [randn(1000, 300), randn(1000, 300)], F.mse_loss, profiles=P, rtol=1e-6, atol=1e-8)
# pools / convs with odd geometry
check("maxpool/pad", {"op": "max_pool2d", "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1]}, [randn(2, 3, 5, 5)], lambda x: F.max_pool2d(x, 3, 1, 1), profiles=P)
check("avgpool/pad_excl", {"op": "avg_pool2d", "geometry": {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}, "count_include_pad": False}, [randn(2, 3, 6, 7)], lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), profiles=P)
check("conv/1x1", {"op": "conv2d", "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}, [randn(4, 16, 9, 9), randn(32, 16, 1, 1), randn(32)], lambda x, w, b: F.conv2d(x, w, b), profiles=P)
check("conv/depthwise", {"op": "conv2d", "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 8}, [randn(4, 8, 9, 9), randn(8, 1, 3, 3), randn(8)], lambda x, w, b: F.conv2d(x, w, b, 1, 1, 1, 8), profiles=P)
check("conv/1d-like", {"op": "conv2d", "stride": [1, 2], "padding": [0, 3], "dilation": [1, 1], "groups": 1}, [randn(4, 3, 1, 50), randn(5, 3, 1, 7), randn(5)], lambda x, w, b: F.conv2d(x, w, b, (1, 2), (0, 3)), profiles=P)
check("conv/kernel>input+pad", {"op": "conv2d", "stride": [1, 1], "padding": [2, 2], "dilation": [1, 1], "groups": 1}, [randn(1, 2, 3, 3), randn(3, 2, 5, 5), randn(3)], lambda x, w, b: F.conv2d(x, w, b, 1, 2), profiles=P)
check("smooth_max_pool", {"op": "smooth_max_pool2d", "geometry": {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}, "beta": 3.0}, [randn(2, 3, 4, 4)], lambda x: F.avg_pool2d(T.exp(3.0 * x), 2, 2, divisor_override=1).log() / 3.0, profiles=P)
# index edge cases
check("index_select/repeat", {"op": "index_select", "axis": 1}, [randn(3, 4), np.array([3, 3, 0, 3], np.float32)], lambda x, i: T.index_select(x, 1, i.long()), diff={0}, profiles=P)
check("gather/axis0", {"op": "gather", "axis": 0}, [randn(3, 4), rng.integers(0, 3, (5, 4)).astype(np.float32)], lambda x, i: T.gather(x, 0, i.long()), diff={0}, profiles=P)
check("scatter_add/axis0dup", {"op": "scatter_add", "axis": 0}, [randn(3, 4), np.zeros((6, 4), np.float32), randn(6, 4)], lambda x, i, s: x.scatter_add(0, i.long(), s), diff={0, 2}, profiles=P)

def scan(a, u):
    hs, h = [], T.zeros_like(u[:, 0])
    for t in range(u.shape[1]):
        h = a[:, t] * h + u[:, t]; hs.append(h)
    return T.stack(hs, 1)
check("selective_scan", {"op": "selective_scan"}, [rng.uniform(0.5, 1.0, (2, 9, 3)).astype(np.float32), randn(2, 9, 3)], scan, profiles=P)

for job in JOBS:
    job.result()  # re-raises a job's own error (a harness bug, not a disagreement)
print(f"{len(JOBS)} runs, {len(FAILS)} disagreements")
for f in sorted(FAILS):
    print(" | ".join(f)[:600])
sys.exit(1 if FAILS else 0)
