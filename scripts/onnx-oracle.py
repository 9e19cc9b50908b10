#!/usr/bin/env python3
"""onnxruntime as an oracle for torchlean's ONNX import: small models (one operator, or the
patterns exporters write) built with `onnx.helper` over the attributes, opsets and operand
forms the importer accepts, run by `torchlean run-graph MODEL.onnx --grad` and by onnxruntime.
Values are compared with onnxruntime's (float32); gradients, which onnxruntime does not give,
with central differences of the same model in float64 run by onnxruntime (one random
direction per differentiable input or initializer). A case that torchlean refuses is listed
apart: a refusal is not a wrong answer, but each should be one the docs (docs/onnx.md) name.

    python3 -m venv .oracle-venv && .oracle-venv/bin/pip install numpy onnx onnxruntime
    .oracle-venv/bin/python scripts/onnx-oracle.py [--torchlean target/release/torchlean] [--profiles checked_cpu,strict_native_cpu]

Prints every disagreement and refusal; exits 1 if there is a disagreement.
"""
import argparse, concurrent.futures, copy, os, shlex, shutil, subprocess, sys, tempfile
import numpy as np
import onnx, onnxruntime as ort
from onnx import helper as H, numpy_helper, TensorProto as TP
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import write_st, read_st, close, judge_run, save_case

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--torchlean", default="target/release/torchlean")
ap.add_argument("--jobs", type=int, default=2)
ap.add_argument("--profiles", default="checked_cpu,strict_native_cpu")
ap.add_argument("--extra", default="", help="arguments added to every run-graph command")
ap.add_argument("--seed", type=int, default=1, help="seed of the random inputs (default 1, the recorded runs'; another draws other values of the same cases)")
ap.add_argument("--only", default="", help="run only the cases whose label contains this")
ap.add_argument("--emit", default="", help="write every case (model, inputs, onnxruntime's outputs and differences) under this directory instead of running torchlean: replay it with scripts/onnx-oracle-replay.py on a machine without onnxruntime (the GPU machine)")
ARGS = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="torchlean-onnx-oracle-")
rng = np.random.default_rng(ARGS.seed)
so = ort.SessionOptions(); so.log_severity_level = 3
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

FAILS, REFUSED, PASSED = [], [], []
UNCHECKED = []  # passed cases with an input whose gradient no finite difference could check
def fail(*f):
    FAILS.append(f); print("disagreement:", " | ".join(f)[:700], flush=True)

def randn(*s, lo=None, scale=1.0):
    a = np.asarray(rng.standard_normal(s) * scale, dtype=np.float32)
    if lo is not None: a = np.asarray(np.abs(a) + np.float32(lo), dtype=np.float32)
    return a

def as_double(model):
    """The same model computing in float64 (for onnxruntime's finite differences)."""
    m = copy.deepcopy(model)
    g = m.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TP.FLOAT: vi.type.tensor_type.elem_type = TP.DOUBLE
    for i, t in enumerate(g.initializer):
        if t.data_type == TP.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and a.i == TP.FLOAT: a.i = TP.DOUBLE
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TP.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    return m

def with_loss(nodes, outputs):
    """loss = Σ_i ReduceSum(y_i · c_i): the cotangent c_i of each output is an extra input."""
    extra, ins, parts = [], [], []
    for y in outputs:
        extra += [H.make_node("Mul", [y, f"c_{y}"], [f"yc_{y}"]),
                  H.make_node("ReduceSum", [f"yc_{y}"], [f"l_{y}"], keepdims=0)]
        parts.append(f"l_{y}")
    acc = parts[0]
    for k, p in enumerate(parts[1:]):
        extra.append(H.make_node("Add", [acc, p], [f"lsum{k}"])); acc = f"lsum{k}"
    extra.append(H.make_node("Identity", [acc], ["loss"]))
    return nodes + extra

ELEM = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int64): TP.INT64, np.dtype(bool): TP.BOOL}
def build(nodes, inputs, outputs, inits, opset, loss):
    ins = [H.make_tensor_value_info(k, ELEM[v.dtype], list(v.shape)) for k, v in inputs.items()]
    outs = [H.make_tensor_value_info(y, TP.FLOAT, None) for y in outputs]
    if loss:
        ins += [H.make_tensor_value_info(f"c_{y}", TP.FLOAT, None) for y in outputs]
        nodes = with_loss(nodes, outputs)
        outs.append(H.make_tensor_value_info("loss", TP.FLOAT, []))
    g = H.make_graph(nodes, "oracle", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return H.make_model(g, opset_imports=[H.make_opsetid("", opset)], ir_version=8)

def ort_run(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))

JOBS = []
POOL = concurrent.futures.ThreadPoolExecutor(max_workers=ARGS.jobs)
def case(label, nodes, inputs, outputs, inits=None, opset=17, grad=True, rtol=1e-4, atol=2e-5, expect_refusal=False, consts=(), expect_error=None, ref64=False, expect=None):
    """Queues one model on every profile. `inputs`: name -> array (float32, int64 or bool;
    torchlean gets them as float32); `inits`: initializers (parameters when float32, except
    those named in `consts`, which the importer reads as attributes: exponents, bounds, pad
    values); `expect_error`: a documented run-time refusal (exit 1 with this text); `ref64`:
    compare with onnxruntime's float64 run (long sums, where its float32 sum is the less
    accurate of the two); `expect`: outputs to compare with instead of onnxruntime's, where
    ONNX leaves the result open and torchlean follows PyTorch (NaN in a max pool)."""
    if ARGS.only and ARGS.only not in label: return
    inits = inits or {}
    plain = build(nodes, inputs, outputs, inits, opset, False)
    if expect_refusal:  # onnxruntime may refuse it too (an unknown attribute): nothing to compare
        for prof in ([""] if ARGS.emit else ARGS.profiles.split(",")):
            JOBS.append(POOL.submit(compare, label, plain, inputs, {}, prof, {}, {}, False, rtol, atol, True, None))
        return
    try:
        want = ort_run(plain, inputs)
        if ref64:
            w64 = ort_run(as_double(plain), {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in inputs.items()})
            want = {k: v.astype(np.float32) for k, v in w64.items()}
        if expect is not None:
            want = expect
    except Exception as e:  # a malformed case, or one onnxruntime refuses: say so, don't count it
        print(f"skipped {label}: onnxruntime refused it ({str(e).splitlines()[0][:200]})", flush=True); return
    cs = {f"c_{y}": rng.standard_normal(want[y].shape).astype(np.float32) for y in outputs}
    model = build(nodes, inputs, outputs, inits, opset, grad)
    fd = finite_differences(nodes, inputs, outputs, inits, opset, cs, consts) if grad else {}
    for prof in ([""] if ARGS.emit else ARGS.profiles.split(",")):
        JOBS.append(POOL.submit(compare, label, model, inputs, cs if grad else {}, prof, want, fd, grad, rtol, atol, expect_refusal, expect_error))

def finite_differences(nodes, inputs, outputs, inits, opset, cs, consts):
    """For each float input and initializer: a random direction u and (L(x+εu) − L(x−εu))/2ε
    in float64, L the loss of the model (its cotangents fixed)."""
    m = as_double(build(nodes, inputs, outputs, inits, opset, True))
    feeds = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in inputs.items()}
    feeds.update({k: v.astype(np.float64) for k, v in cs.items()})
    try:
        ort_run(m, feeds)
        dt, rel = np.float64, 1e-6
    except Exception:
        # onnxruntime has no float64 kernel for it (Conv, pooling, GRU, LSTM, Erf, ...):
        # differences in float32 with a longer step, checked more loosely (see compare)
        m = build(nodes, inputs, outputs, inits, opset, True)
        feeds = {k: v for k, v in inputs.items()}
        feeds.update(cs)
        dt, rel = np.float32, 1e-3
    res = {"_f32": dt == np.float32}
    for name in [k for k, v in inputs.items() if v.dtype == np.float32] + [k for k, v in inits.items() if v.dtype == np.float32 and k not in consts]:
        x = feeds[name] if name in feeds else inits[name].astype(dt)
        if not np.isfinite(x).all():
            continue  # a direction through ±inf has no finite difference
        usual = np.abs(x)[np.abs(x) < 1e30]  # a mask's f32::MIN entries do not set the step
        eps = rel * max(1.0, float(np.median(usual)) if usual.size else 1.0)
        def loss_at(xv):
            if name in inputs:
                f = dict(feeds); f[name] = xv; mm = m
            else:
                mm = copy.deepcopy(m); f = feeds
                for i, t in enumerate(mm.graph.initializer):
                    if t.name == name: mm.graph.initializer[i].CopyFrom(numpy_helper.from_array(xv, name))
            return float(ort_run(mm, f)["loss"])
        # A kink (relu's 0, max's tie) at distance t < h from x along u makes the central
        # difference a chord: with slopes a and b on its two sides, its error is exactly
        # |a − b|·(h − t)/2h = |r(h)|/2, r(h) = (L(x+h) − 2L(x) + L(x−h))/h the difference of
        # the one-sided differences, while on a smooth L, r(s) ≈ s·L'' doubles with s. So the
        # difference at h is kept when r(h) is small against it (then any kink's error is), or
        # when r doubles from h to 2h and again to 4h (no single kink does both:
        # r(s) = (b − a)(1 − t/s) doubles from h to 2h only at t = 2h/3, and then grows by
        # 1.25 to 4h); otherwise another direction is drawn (at most three), then the input's
        # gradient is left unchecked and counted as such.
        l0 = loss_at(np.asarray(x, dtype=dt))
        h = eps / 2
        if not np.isfinite(l0):
            u = rng.standard_normal(x.shape)
            res[name] = (u, (loss_at(np.asarray(x + h * u, dtype=dt)) - loss_at(np.asarray(x - h * u, dtype=dt))) / (2 * h))
            continue
        # the loss's own rounding (f32 sums of many terms: onnxruntime's order is not known)
        noise = (2e-6 if dt == np.float32 else 1e-13) * (1 + abs(l0))
        for _ in range(3):
            u = rng.standard_normal(x.shape)
            at = {k: loss_at(np.asarray(x + k * h * u, dtype=dt)) for k in (-4, -2, -1, 1, 2, 4)}
            d = (at[1] - at[-1]) / (2 * h)
            r = {k: (at[k] - 2 * l0 + at[-k]) / (k * h) for k in (1, 2, 4)}
            slack = {k: 4 * noise / (k * h) for k in (1, 2, 4)}
            # a fifth of the tolerance `judge_run` holds the gradient to
            small = abs(r[1]) / 2 <= (4e-3 if dt == np.float32 else 4e-4) * abs(d) + slack[1]
            doubles = lambda lo, hi: abs(r[hi] - 2 * r[lo]) <= 0.5 * abs(r[lo]) + slack[lo] + slack[hi]
            if small or (doubles(1, 2) and doubles(2, 4)):
                res[name] = (u, d)
                break
        else:
            res.setdefault("_skipped", []).append(name)
    return res

EMITTED = [0]
def compare(label, model, inputs, cs, prof, want, fd, grad, rtol, atol, expect_refusal, expect_error):
    work = tempfile.mkdtemp(dir=WORK)
    onnx.save(model, f"{work}/m.onnx")
    write_st(f"{work}/in.st", {**{k: v.astype(np.float32) for k, v in inputs.items()}, **cs})
    meta = dict(label=label, grad=grad, rtol=rtol, atol=atol, expect_refusal=expect_refusal, expect_error=expect_error)
    if ARGS.emit:
        # a case to replay where onnxruntime is not (scripts/onnx-oracle-replay.py)
        EMITTED[0] += 1
        d = os.path.join(ARGS.emit, f"{EMITTED[0]:05d}")
        shutil.copytree(work, d)
        save_case(d, meta, want, fd)
        return
    verdict = judge_run(ARGS.torchlean, work, prof, shlex.split(ARGS.extra), meta, want, fd)
    if fd.get("_skipped") and verdict[0] == "pass":
        UNCHECKED.append((label, prof, ", ".join(fd["_skipped"])))
    record(verdict, label, prof)
    shutil.rmtree(work, ignore_errors=True)

def record(verdict, label, prof):
    kind, msg = verdict
    if kind == "pass": PASSED.append((label, prof))
    elif kind == "refused": REFUSED.append((label, prof, msg)); print(f"refused: {label} | {prof} | {msg}", flush=True)
    else: fail(label, prof, msg)

N = H.make_node
def i64(*v): return np.array(v, np.int64)
def f32(*v): return np.array(v, np.float32)

# ---- elementwise maps, with special values (forward only) ----
SPECIAL = f32(np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 1e-40, -3.5, 2.5, 88.0, -88.0)
for op in ["Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Neg", "Abs", "Sin", "Cos", "Softplus", "Erf", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Reciprocal"]:
    pos = op in ("Log", "Sqrt")
    case(op, [N(op, ["x"], ["y"])], {"x": randn(3, 5, lo=0.2) if pos else randn(3, 5, scale=2)}, ["y"])
    case(op + "/special", [N(op, ["x"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], grad=False)
for op in ["Asin", "Acos", "Atanh"]:  # inside the domain, away from its ends (finite differences)
    case(op, [N(op, ["x"], ["y"])], {"x": np.asarray(rng.uniform(-0.9, 0.9, (3, 5)), np.float32)}, ["y"])
    case(op + "/special", [N(op, ["x"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], grad=False)
case("Acosh", [N("Acosh", ["x"], ["y"])], {"x": np.asarray(rng.uniform(1.1, 3.0, (3, 5)), np.float32)}, ["y"])
case("Acosh/special", [N("Acosh", ["x"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], grad=False)
case("Gelu", [N("Gelu", ["x"], ["y"])], {"x": randn(4, 6, scale=2)}, ["y"], opset=20)
case("Gelu/special", [N("Gelu", ["x"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], opset=20, grad=False)
case("Gelu/tanh", [N("Gelu", ["x"], ["y"], approximate="tanh")], {"x": randn(4, 6, scale=2)}, ["y"], opset=20)

# ---- binary maps, broadcasting, one-element constants on either side ----
for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]:
    for sa, sb in [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((), (3, 2)), ((2, 3), ())]:
        a = randn(*sa, lo=0.3) if op == "Pow" else randn(*sa)
        b = randn(*sb, lo=0.5) if op == "Div" else randn(*sb)
        if op == "Pow":
            # the exponent must be a constant scalar: a one-element initializer
            if int(np.prod(sb)) != 1: continue
            b = f32(1.7).reshape(sb)
            case(f"{op}{sa}^const{sb}", [N(op, ["a", "b"], ["y"])], {"a": a}, ["y"], inits={"b": b}, consts={"b"})
            continue
        case(f"{op}{sa}{sb}", [N(op, ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    if op == "Pow": continue
    # a one-element constant as the first or second operand (mapped to scale / add_scalar)
    for shape in [(), (1,), (1, 1)]:
        k = f32(2.5).reshape(shape)
        x = randn(3, 4, lo=0.5)
        case(f"{op}(const{shape}, x)", [N(op, ["k", "x"], ["y"])], {"x": x}, ["y"], inits={"k": k})
        case(f"{op}(x, const{shape})", [N(op, ["x", "k"], ["y"])], {"x": x}, ["y"], inits={"k": k})
        case(f"{op}(Constant{shape}, x)", [N("Constant", [], ["k"], value=numpy_helper.from_array(k)), N(op, ["k", "x"], ["y"])], {"x": x}, ["y"])
    case(op + "/special", [N(op, ["a", "b"], ["y"])], {"a": SPECIAL.reshape(3, 4), "b": SPECIAL[::-1].copy().reshape(3, 4)}, ["y"], grad=False)
for op in ["Max", "Min"]:
    case(f"{op}/3 operands", [N(op, ["a", "b", "c"], ["y"])], {"a": randn(2, 3), "b": randn(3), "c": randn(2, 1)}, ["y"])
    case(f"{op}/1 operand", [N(op, ["a"], ["y"])], {"a": randn(2, 3)}, ["y"])
case("Pow(x, 2)", [N("Pow", ["x", "e"], ["y"])], {"x": randn(3, 4)}, ["y"], inits={"e": f32(2.0)}, consts={"e"})
case("Pow(x, 0.5)", [N("Pow", ["x", "e"], ["y"])], {"x": randn(3, 4, lo=0.1)}, ["y"], inits={"e": f32(0.5)}, consts={"e"})
case("Pow(x, -1) special", [N("Pow", ["x", "e"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], inits={"e": f32(-1.0)}, grad=False)
case("Pow(x, int64 3)", [N("Pow", ["x", "e"], ["y"])], {"x": randn(3, 4)}, ["y"], inits={"e": i64(3)})
case("Pow(const, x)", [N("Pow", ["b", "x"], ["y"])], {"x": randn(3, 4)}, ["y"], inits={"b": f32(2.0)})

# ---- Clip ----
case("Clip(min,max)", [N("Clip", ["x", "lo", "hi"], ["y"])], {"x": randn(4, 5, scale=2)}, ["y"], inits={"lo": f32(-0.5), "hi": f32(0.7)}, consts={"lo", "hi"})
case("Clip(min)", [N("Clip", ["x", "lo"], ["y"])], {"x": randn(4, 5, scale=2)}, ["y"], inits={"lo": f32(-0.5)}, consts={"lo"})
case("Clip(,max)", [N("Clip", ["x", "", "hi"], ["y"])], {"x": randn(4, 5, scale=2)}, ["y"], inits={"hi": f32(0.7)}, consts={"hi"})
case("Clip()", [N("Clip", ["x"], ["y"])], {"x": randn(4, 5, scale=2)}, ["y"])
case("Clip(min>max)", [N("Clip", ["x", "lo", "hi"], ["y"])], {"x": randn(4, 5, scale=2)}, ["y"], inits={"lo": f32(0.5), "hi": f32(-0.5)})
case("Clip/special", [N("Clip", ["x", "lo", "hi"], ["y"])], {"x": SPECIAL.reshape(3, 4)}, ["y"], inits={"lo": f32(-0.5), "hi": f32(0.7)}, grad=False)

# ---- Where, Trilu ----
cond = rng.random((3, 4)) > 0.5
case("Where(input cond)", [N("Where", ["c", "a", "b"], ["y"])], {"c": cond, "a": randn(3, 4), "b": randn(1, 4)}, ["y"])
case("Where(const cond, broadcast)", [N("Where", ["c", "a", "b"], ["y"])], {"a": randn(2, 3, 4), "b": randn(4)}, ["y"], inits={"c": rng.random((3, 1)) > 0.5})
case("Where(initializer cond)", [N("Where", ["c", "a", "b"], ["y"])], {"a": randn(3, 4), "b": randn(3, 4)}, ["y"], inits={"c": cond})
for up in (0, 1):
    for k in (None, 0, 1, -2, 5):
        ins = ["x"] + (["k"] if k is not None else [])
        case(f"Trilu(upper={up}, k={k})", [N("Trilu", ins, ["y"], upper=up)], {"x": randn(2, 4, 5)}, ["y"], inits=({"k": i64(k)} if k is not None else {}))

# ---- Softmax family ----
for opset in (13, 17):
    for ax in (None, 0, 1, -1, -2):
        kw = {} if ax is None else {"axis": ax}
        for op in ("Softmax", "LogSoftmax"):
            case(f"{op}(axis={ax}) opset {opset}", [N(op, ["x"], ["y"], **kw)], {"x": randn(2, 3, 4, scale=3)}, ["y"], opset=opset)
case("Softmax/-inf rows", [N("Softmax", ["x"], ["y"], axis=1)], {"x": f32([-np.inf, 0, 1], [-np.inf, -np.inf, 2], [1e30, 1e30, 0])}, ["y"], grad=False)
case("Softmax/all -inf", [N("Softmax", ["x"], ["y"], axis=1)], {"x": f32([-np.inf, -np.inf], [0, 1])}, ["y"], grad=False)
case("LogSoftmax/-inf", [N("LogSoftmax", ["x"], ["y"], axis=1)], {"x": f32([-np.inf, 0, 1], [-np.inf, -np.inf, 2])}, ["y"], grad=False)

# ---- reductions ----
x345 = randn(3, 4, 5)
for kd in (0, 1):
    for axes in (None, [0], [-1], [0, 2], [2, -3], []):
        ins = ["x"] + (["axes"] if axes is not None else [])
        init = {"axes": i64(*axes)} if axes is not None else {}
        case(f"ReduceSum(axes={axes}, keepdims={kd})", [N("ReduceSum", ins, ["y"], keepdims=kd)], {"x": x345}, ["y"], inits=init, opset=13)
        case(f"ReduceMean18(axes={axes}, keepdims={kd})", [N("ReduceMean", ins, ["y"], keepdims=kd)], {"x": x345}, ["y"], inits=init, opset=18)
        if axes:
            case(f"ReduceMean17(axes={axes}, keepdims={kd})", [N("ReduceMean", ["x"], ["y"], keepdims=kd, axes=axes)], {"x": x345}, ["y"], opset=17)
    case(f"ReduceSum(noop, no axes, keepdims={kd})", [N("ReduceSum", ["x"], ["y"], keepdims=kd, noop_with_empty_axes=1)], {"x": x345}, ["y"], opset=13)
    case(f"ReduceMean18(noop, empty axes, keepdims={kd})", [N("ReduceMean", ["x", "axes"], ["y"], keepdims=kd, noop_with_empty_axes=1)], {"x": x345}, ["y"], inits={"axes": i64()}, opset=18)
    case(f"ReduceMean17(no axes, keepdims={kd})", [N("ReduceMean", ["x"], ["y"], keepdims=kd)], {"x": x345}, ["y"], opset=17)
case("ReduceSum/empty axis", [N("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], {"x": np.zeros((3, 0, 2), np.float32)}, ["y"], inits={"axes": i64(1)}, grad=False)
case("ReduceMean/long", [N("ReduceMean", ["x"], ["y"], keepdims=0, axes=[1])], {"x": randn(2, 300000, scale=1) + np.float32(100)}, ["y"], grad=False, rtol=2e-6, atol=0, ref64=True)
case("ReduceSum/long", [N("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], {"x": randn(2, 300000) + np.float32(100)}, ["y"], inits={"axes": i64(1)}, opset=13, grad=False, rtol=2e-6, atol=0, ref64=True)

# ---- products ----
for ta in (0, 1):
    for tb in (0, 1):
        for cshape in (None, (4,), (3, 4), (1, 4), (3, 1), ()):
            for alpha, beta in ((1.0, 1.0), (0.5, -2.0)):
                a = randn(5, 3) if ta else randn(3, 5)
                b = randn(4, 5) if tb else randn(5, 4)
                ins = ["a", "b"] + (["c"] if cshape is not None else [])
                inputs = {"a": a, "b": b}
                if cshape is not None: inputs["c"] = randn(*cshape)
                case(f"Gemm(transA={ta}, transB={tb}, C={cshape}, alpha={alpha}, beta={beta})", [N("Gemm", ins, ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)], inputs, ["y"])
case("Gemm(initializer W, bias)", [N("Gemm", ["x", "w", "b"], ["y"], transB=1)], {"x": randn(6, 5)}, ["y"], inits={"w": randn(4, 5), "b": randn(4)})
for sa, sb in [((5,), (5,)), ((5,), (2, 5, 3)), ((2, 4, 5), (5,)), ((4, 5), (5, 3)), ((2, 1, 4, 5), (3, 5, 2)), ((3, 5), (2, 5, 4)), ((5,), (5, 3)), ((4, 5), (5,))]:
    case(f"MatMul{sa}{sb}", [N("MatMul", ["a", "b"], ["y"])], {"a": randn(*sa), "b": randn(*sb)}, ["y"])
case("MatMul/empty k", [N("MatMul", ["a", "b"], ["y"])], {"a": np.zeros((3, 0), np.float32), "b": np.zeros((0, 2), np.float32)}, ["y"], grad=False)

# ---- convolution and pooling ----
for (st, pd, dl, gr, ap) in [((1, 1), (0, 0, 0, 0), (1, 1), 1, None), ((2, 1), (1, 2, 1, 2), (1, 1), 1, None), ((1, 1), (1, 1, 1, 1), (2, 2), 1, None),
                             ((2, 2), (1, 0, 1, 0), (1, 1), 2, None), ((1, 1), None, (1, 1), 1, "VALID"), ((1, 1), None, (1, 1), 1, "SAME_UPPER"),
                             ((1, 1), (0, 1, 1, 0), (1, 1), 1, None), ((1, 1), (1, 1, 1, 1), (1, 1), 4, None)]:
    kw = {"strides": list(st), "dilations": list(dl), "group": gr}
    if pd is not None: kw["pads"] = list(pd)
    if ap is not None: kw["auto_pad"] = ap
    for bias in (0, 1):
        ins = ["x", "w"] + (["b"] if bias else [])
        inits = {"w": randn(8, 4 // gr, 3, 3)}
        if bias: inits["b"] = randn(8)
        case(f"Conv(strides={st}, pads={pd}, dil={dl}, group={gr}, auto_pad={ap}, bias={bias})", [N("Conv", ins, ["y"], **kw)], {"x": randn(2, 4, 7, 6)}, ["y"], inits=inits)
for ap in ("SAME_UPPER", "SAME_LOWER"):
    for k, st, dl in (((3, 3), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1)), ((4, 3), (2, 3), (1, 1))):  # (onnxruntime has no SAME with dilations)
        case(f"Conv(auto_pad={ap}, k={k}, strides={st}, dil={dl})", [N("Conv", ["x", "w", "b"], ["y"], auto_pad=ap, strides=list(st), dilations=list(dl))], {"x": randn(2, 4, 7, 6)}, ["y"], inits={"w": randn(5, 4, *k), "b": randn(5)})
    case(f"Conv1d(auto_pad={ap})", [N("Conv", ["x", "w"], ["y"], auto_pad=ap)], {"x": randn(2, 3, 9)}, ["y"], inits={"w": randn(5, 3, 4)})
case("ConvTranspose(asymmetric pads)", [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[0, 1, 1, 2])], {"x": randn(2, 4, 5, 4)}, ["y"], inits={"w": randn(4, 3, 3, 3)})
case("Conv1d", [N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], strides=[2])], {"x": randn(2, 3, 9)}, ["y"], inits={"w": randn(5, 3, 3), "b": randn(5)})
case("Conv(kernel_shape attr)", [N("Conv", ["x", "w"], ["y"], kernel_shape=[3, 2])], {"x": randn(1, 2, 5, 5)}, ["y"], inits={"w": randn(3, 2, 3, 2)})
for op in ("MaxPool", "AveragePool"):
    for (k, st, pd, cip) in [((2, 2), (2, 2), (0, 0, 0, 0), 0), ((3, 3), (1, 1), (1, 1, 1, 1), 0), ((3, 3), (1, 1), (1, 1, 1, 1), 1), ((3, 2), (2, 1), (1, 0, 1, 0), 0), ((2, 2), None, None, 0), ((3, 3), (2, 2), (0, 1, 1, 0), 0)]:
        kw = {"kernel_shape": list(k)}
        if st: kw["strides"] = list(st)
        if pd: kw["pads"] = list(pd)
        if op == "AveragePool": kw["count_include_pad"] = cip
        elif cip: continue
        case(f"{op}(k={k}, strides={st}, pads={pd}, cip={cip})", [N(op, ["x"], ["y"], **kw)], {"x": randn(2, 3, 7, 6)}, ["y"])
    case(f"{op}1d", [N(op, ["x"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 1])], {"x": randn(2, 3, 9)}, ["y"])
    case(f"{op}(ceil_mode=1)", [N(op, ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)], {"x": randn(1, 2, 5, 5)}, ["y"])
# a NaN in a window: onnxruntime skips it (its max compares with >), PyTorch's max_pool2d
# returns NaN, and so does torchlean (ONNX does not say)
sp = SPECIAL.reshape(1, 1, 3, 4)
win = np.stack([sp[0, 0, i:i + 2, j:j + 2] for i in range(2) for j in range(3)]).reshape(2, 3, 4)
case("MaxPool/special", [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], {"x": sp}, ["y"], grad=False,
     expect={"y": np.where(np.isnan(win).any(-1), np.nan, np.nanmax(np.where(np.isnan(win), -np.inf, win), -1)).reshape(1, 1, 2, 3).astype(np.float32)})
for op in ("MaxPool", "AveragePool"):
    for ap in ("SAME_UPPER", "SAME_LOWER"):
        for k, st in (((3, 3), (1, 1)), ((2, 2), (2, 2)), ((4, 3), (3, 2))):
            kw = {"count_include_pad": 1} if op == "AveragePool" else {}
            case(f"{op}(auto_pad={ap}, k={k}, strides={st})", [N(op, ["x"], ["y"], kernel_shape=list(k), strides=list(st), auto_pad=ap, **kw)], {"x": randn(2, 3, 7, 6)}, ["y"])
    for k, st, pd in (((3, 3), (2, 2), (0, 0, 0, 0)), ((2, 2), (2, 2), (0, 0, 0, 0)), ((3, 3), (2, 2), (1, 1, 1, 1)), ((3, 2), (2, 3), (1, 0, 1, 0))):
        case(f"{op}(ceil_mode=1, k={k}, strides={st}, pads={pd})", [N(op, ["x"], ["y"], kernel_shape=list(k), strides=list(st), pads=list(pd), ceil_mode=1)], {"x": randn(2, 3, 7, 8)}, ["y"])
    case(f"{op}1d(ceil_mode=1)", [N(op, ["x"], ["y"], kernel_shape=[3], strides=[2], ceil_mode=1)], {"x": randn(2, 3, 10)}, ["y"])
case("AveragePool(asymmetric pads, count_include_pad=1)", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 1, 1, 0], count_include_pad=1)], {"x": randn(2, 3, 6, 5)}, ["y"])
# forty-eighth session: averages whose divisor the op cannot give (rescaled per output)
case("AveragePool(asymmetric pads, count_include_pad=0)", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 1, 1, 0])], {"x": randn(2, 3, 6, 5)}, ["y"])
for ap in ("SAME_UPPER", "SAME_LOWER"):
    case(f"AveragePool(auto_pad={ap}, count_include_pad=0)", [N("AveragePool", ["x"], ["y"], kernel_shape=[4, 3], strides=[3, 2], auto_pad=ap)], {"x": randn(2, 3, 7, 6)}, ["y"])
for cip in (0, 1):
    case(f"AveragePool(ceil_mode=1, partial windows, pads, cip={cip})", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=cip)], {"x": randn(2, 3, 8, 7)}, ["y"])
case("MaxPool(dilations)", [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])], {"x": randn(1, 2, 6, 6)}, ["y"])
case("GlobalAveragePool", [N("GlobalAveragePool", ["x"], ["y"])], {"x": randn(2, 3, 4, 5)}, ["y"])
case("GlobalAveragePool1d", [N("GlobalAveragePool", ["x"], ["y"])], {"x": randn(2, 3, 7)}, ["y"])
for (st, pd, op_, dl, gr) in [((1, 1), (0, 0, 0, 0), (0, 0), (1, 1), 1), ((2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1), ((2, 1), (0, 1, 0, 1), (1, 0), (1, 1), 2), ((1, 1), (1, 1, 1, 1), (0, 0), (2, 2), 1)]:
    case(f"ConvTranspose(strides={st}, pads={pd}, out_pad={op_}, dil={dl}, group={gr})",
         [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=list(st), pads=list(pd), output_padding=list(op_), dilations=list(dl), group=gr)],
         {"x": randn(2, 4, 5, 4)}, ["y"], inits={"w": randn(4, 6 // gr, 3, 3), "b": randn(6)})

# ---- normalization ----
for opset in (14, 15):
    case(f"BatchNormalization opset {opset}", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)], {"x": randn(2, 3, 4, 5)}, ["y"],
         inits={"s": randn(3), "b": randn(3), "m": randn(3), "v": randn(3, lo=0.5)}, opset=opset)
case("BatchNormalization 2-D", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], {"x": randn(6, 3)}, ["y"], inits={"s": randn(3), "b": randn(3), "m": randn(3), "v": randn(3, lo=0.5)})
case("BatchNormalization large mean", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], {"x": randn(2, 3, 4) + np.float32(1000)}, ["y"], inits={"s": randn(3), "b": randn(3), "m": randn(3) + np.float32(1000), "v": randn(3, lo=0.5)})
for ax in (-1, 1, 2, -2):
    for bias in (0, 1):
        x = randn(2, 3, 4)
        nshape = x.shape[ax:] if ax < 0 else x.shape[ax:]
        ins = ["x", "s"] + (["b"] if bias else [])
        inits = {"s": randn(*nshape)}
        if bias: inits["b"] = randn(*nshape)
        case(f"LayerNormalization(axis={ax}, bias={bias})", [N("LayerNormalization", ins, ["y"], axis=ax, epsilon=1e-5)], {"x": x}, ["y"], inits=inits)
# x near 1000 in f32: PyTorch's own f32 layer norm is off by 3.4e-4 from the f64 value here
case("LayerNormalization/offset", [N("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)], {"x": randn(3, 512) + np.float32(1000)}, ["y"], inits={"s": randn(512), "b": randn(512)}, grad=False, ref64=True, atol=1e-4)

# ---- layout ----
x234 = randn(2, 3, 4)
for shape, az in [((6, 4), 0), ((0, -1), 0), ((-1,), 0), ((2, 0, 2, 2), 0), ((4, 3, 2), 1)]:
    case(f"Reshape{shape} allowzero={az}", [N("Reshape", ["x", "s"], ["y"], allowzero=az)], {"x": x234}, ["y"], inits={"s": i64(*shape)}, opset=14)
for ax in (0, 1, 2, 3, -1, -3):
    case(f"Flatten(axis={ax})", [N("Flatten", ["x"], ["y"], axis=ax)], {"x": x234}, ["y"])
case("ReduceSum of a 0-d value", [N("ReduceSum", ["x"], ["y"], keepdims=1)], {"x": randn()}, ["y"], opset=13)
case("ReduceMean of a 0-d value", [N("ReduceMean", ["x"], ["y"], keepdims=0)], {"x": randn()}, ["y"], opset=17)
x1 = randn(1, 3, 1, 4)
for axes in (None, [0], [-2], [0, 2]):
    ins = ["x"] + (["a"] if axes is not None else [])
    case(f"Squeeze(axes={axes})", [N("Squeeze", ins, ["y"])], {"x": x1}, ["y"], inits=({"a": i64(*axes)} if axes is not None else {}))
for axes in ([0], [-1], [1, 3], [-1, 0], [3, 0]):
    case(f"Unsqueeze(axes={axes})", [N("Unsqueeze", ["x", "a"], ["y"])], {"x": randn(3, 4)}, ["y"], inits={"a": i64(*axes)})
case("Transpose(default perm)", [N("Transpose", ["x"], ["y"])], {"x": x234}, ["y"])
case("Transpose(perm)", [N("Transpose", ["x"], ["y"], perm=[1, 2, 0])], {"x": x234}, ["y"])
for shape in ((2, 1, 4), (3, 1), (1,), (2, 3, 4), (1, 1, 1, 1)):
    case(f"Expand{shape}", [N("Expand", ["x", "s"], ["y"])], {"x": randn(3, 1)}, ["y"], inits={"s": i64(*shape)})
for ax in (0, 1, -1):
    case(f"Concat(axis={ax})", [N("Concat", ["a", "b", "c"], ["y"], axis=ax)], {"a": randn(2, 3), "b": randn(2, 3), "c": randn(2, 3)}, ["y"])
case("Concat/with constant", [N("Concat", ["a", "k"], ["y"], axis=1)], {"a": randn(2, 3)}, ["y"], inits={"k": randn(2, 2)})
x56 = randn(5, 6)
case("Slice(two axes, steps 2 and -1)", [N("Slice", ["x", "s", "e", "a", "p"], ["y"])], {"x": x56}, ["y"], inits={"s": i64(0, -1), "e": i64(5, -100), "a": i64(0, 1), "p": i64(2, -1)})
case("Slice(step -3)", [N("Slice", ["x", "s", "e", "a", "p"], ["y"])], {"x": randn(4, 11)}, ["y"], inits={"s": i64(10), "e": i64(0), "a": i64(1), "p": i64(-3)})
case("Slice(step 2, empty)", [N("Slice", ["x", "s", "e", "a", "p"], ["y"])], {"x": x56}, ["y"], inits={"s": i64(3), "e": i64(1), "a": i64(1), "p": i64(2)}, grad=False)
for st, en, ax, sp in [((1,), (4,), (1,), None), ((-3,), (10**9,), (0,), None), ((0, 1), (-1, -1), None, None), ((4,), (-10,), (1,), (-1,)),
                       ((-1,), (-(2**63),), (0,), (-1,)), ((0,), (6,), (1,), (2,)), ((2,), (2,), (0,), None), ((5,), (1,), (0,), None), ((-100,), (100,), (-1,), None)]:
    ins, inits = ["x", "s", "e"], {"s": i64(*st), "e": i64(*en)}
    if ax is not None or sp is not None:
        ins.append("a"); inits["a"] = i64(*(ax if ax is not None else range(len(st))))
    if sp is not None:
        ins.append("p"); inits["p"] = i64(*sp)
    case(f"Slice(starts={st}, ends={en}, axes={ax}, steps={sp})", [N("Slice", ins, ["y"])], {"x": x56}, ["y"], inits=inits)
for pads, val in [((1, 2, 0, 1), None), ((0, 1, 2, 0), 1.5), ((-1, 0, 1, -2), None), ((0, 0, 0, 0), None)]:
    ins = ["x", "p"] + (["v"] if val is not None else [])
    inits = {"p": i64(*pads)}
    if val is not None: inits["v"] = f32(val)
    case(f"Pad(pads={pads}, value={val})", [N("Pad", ins, ["y"], mode="constant")], {"x": randn(3, 4)}, ["y"], inits=inits, opset=13, consts={"v"})
case("Pad(axes) opset 18", [N("Pad", ["x", "p", "", "a"], ["y"])], {"x": randn(3, 4, 2)}, ["y"], inits={"p": i64(1, 2), "a": i64(-1)}, opset=18)
for mode in ("reflect", "edge", "wrap"):
    for pads in ((0, 1, 0, 1), (2, 3, 1, 0), (1, 0, 2, 2)):
        case(f"Pad({mode}, {pads})", [N("Pad", ["x", "p"], ["y"], mode=mode)], {"x": randn(3, 4)}, ["y"], inits={"p": i64(*pads)}, opset=19 if mode == "wrap" else 13)
    case(f"Pad({mode}, 4-D spatial)", [N("Pad", ["x", "p"], ["y"], mode=mode)], {"x": randn(2, 3, 5, 4)}, ["y"], inits={"p": i64(0, 0, 2, 1, 0, 0, 1, 3)}, opset=19 if mode == "wrap" else 13)
case("Pad(wrap, larger than the axis)", [N("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": randn(3, 2)}, ["y"], inits={"p": i64(0, 5, 0, 3)}, opset=19)
case("Pad(edge, length 1)", [N("Pad", ["x", "p"], ["y"], mode="edge")], {"x": randn(3, 1)}, ["y"], inits={"p": i64(1, 2, 0, 3)}, opset=13)
x69 = randn(6, 9)
case("Split(sizes)", [N("Split", ["x", "s"], ["a", "b", "c"], axis=1)], {"x": x69}, ["a", "b", "c"], inits={"s": i64(2, 3, 4)}, opset=13)
case("Split(equal, opset 13)", [N("Split", ["x"], ["a", "b", "c"], axis=0)], {"x": x69}, ["a", "b", "c"], opset=13)
case("Split(num_outputs=2, uneven) opset 18", [N("Split", ["x"], ["a", "b"], axis=1, num_outputs=2)], {"x": x69}, ["a", "b"], opset=18)
case("Split(num_outputs=4) opset 18", [N("Split", ["x"], ["a", "b", "c", "d"], axis=-1, num_outputs=4)], {"x": x69}, ["a", "b", "c", "d"], opset=18)
x45 = randn(4, 5)
for ax, idx in [(0, i64(2)), (1, i64(-1)), (0, i64(3, 0, 3)), (1, i64([0, 4], [2, 2])), (0, i64(-4, 1))]:
    case(f"Gather(axis={ax}, const idx={idx.tolist()})", [N("Gather", ["x", "i"], ["y"], axis=ax)], {"x": x45}, ["y"], inits={"i": idx})
case("Gather(runtime idx)", [N("Gather", ["x", "i"], ["y"], axis=0)], {"i": i64([1, 3, 3], [0, 2, 1])}, ["y"], inits={"x": x45})
case("Gather(runtime idx, axis 1)", [N("Gather", ["x", "i"], ["y"], axis=1)], {"x": x45, "i": i64(4, 0, 2)}, ["y"])
# forty-eighth session: negative run-time indices count from the end (i + n·(i < 0)); below −n refused
case("Gather(runtime negative idx)", [N("Gather", ["x", "i"], ["y"], axis=0)], {"x": x45, "i": i64(-1, 0)}, ["y"])
case("Gather(runtime idx below -n)", [N("Gather", ["x", "i"], ["y"], axis=0)], {"x": x45, "i": i64(-5, 0)}, ["y"], expect_error="invalid index value -1")
case("GatherElements(runtime negative idx)", [N("GatherElements", ["x", "i"], ["y"], axis=1)], {"x": x45, "i": i64([-1, 0], [2, -5], [0, 0], [4, -2])}, ["y"])
for ax in (0, 1):
    case(f"Gather(axis={ax}, scalar idx)", [N("Gather", ["x", "i"], ["y"], axis=ax)], {"x": x45}, ["y"], inits={"i": np.array(-2, np.int64)})

# ---- constant arithmetic exporters emit ----
case("Shape→Gather→Concat→Reshape", [N("Shape", ["x"], ["s"]), N("Gather", ["s", "zero"], ["b"], axis=0), N("Unsqueeze", ["b", "ax0"], ["b1"]),
                                      N("Concat", ["b1", "m1"], ["ns"], axis=0), N("Reshape", ["x", "ns"], ["y"])],
     {"x": x234}, ["y"], inits={"zero": np.array(0, np.int64), "ax0": i64(0), "m1": i64(-1)})
case("Shape(start,end)", [N("Shape", ["x"], ["s"], start=1, end=-1), N("Cast", ["s"], ["sf"], to=TP.FLOAT), N("Mul", ["x", "sf"], ["y"])], {"x": randn(2, 3, 3)}, ["y"], opset=15)
case("Size", [N("Size", ["x"], ["n"]), N("Cast", ["n"], ["nf"], to=TP.FLOAT), N("Div", ["x", "nf"], ["y"])], {"x": x234}, ["y"])
case("ConstantOfShape", [N("ConstantOfShape", ["s"], ["k"], value=numpy_helper.from_array(f32(0.5))), N("Add", ["x", "k"], ["y"])], {"x": x234}, ["y"], inits={"s": i64(3, 4)})
case("Range", [N("Range", ["a", "b", "d"], ["r"]), N("Cast", ["r"], ["rf"], to=TP.FLOAT), N("Mul", ["x", "rf"], ["y"])], {"x": randn(2, 4)}, ["y"], inits={"a": np.array(5, np.int64), "b": np.array(-3, np.int64), "d": np.array(-2, np.int64)})
case("Range float", [N("Range", ["a", "b", "d"], ["r"]), N("Add", ["x", "r"], ["y"])], {"x": randn(2, 4)}, ["y"], inits={"a": np.array(0.5, np.float32), "b": np.array(2.0, np.float32), "d": np.array(0.4, np.float32)}, consts={"a", "b", "d"})
case("Equal/Not/Where const", [N("Equal", ["p", "q"], ["e"]), N("Not", ["e"], ["ne"]), N("Where", ["ne", "x", "z"], ["y"])], {"x": randn(2, 3)}, ["y"],
     inits={"p": i64(1, 2, 3), "q": i64(1, 0, 3), "z": f32(0.0)})
case("Less/Greater const", [N("Less", ["p", "q"], ["l"]), N("Greater", ["p", "q"], ["g"]), N("Cast", ["l"], ["lf"], to=TP.FLOAT), N("Cast", ["g"], ["gf"], to=TP.FLOAT),
                             N("Sub", ["lf", "gf"], ["d"]), N("Mul", ["x", "d"], ["y"])], {"x": randn(2, 3)}, ["y"], inits={"p": f32(1, 2.5, 3), "q": f32(2, 2, 1)})
case("Identity+Dropout", [N("Identity", ["x"], ["a"]), N("Dropout", ["a"], ["y"])], {"x": x234}, ["y"])
case("Dropout(ratio input, training false)", [N("Dropout", ["x", "r", "t"], ["y"])], {"x": x234}, ["y"], inits={"r": np.array(0.5, np.float32), "t": np.array(False)}, consts={"r"})
case("Cast float", [N("Cast", ["x"], ["y"], to=TP.FLOAT)], {"x": x234}, ["y"])
case("CastLike", [N("CastLike", ["x", "k"], ["y"])], {"x": x234}, ["y"], inits={"k": f32(0.0)}, opset=15, consts={"k"})
case("Cast(int input → float)", [N("Cast", ["i"], ["f"], to=TP.FLOAT), N("Mul", ["x", "f"], ["y"])], {"x": randn(3), "i": i64(1, -2, 3)}, ["y"])

# ---- patterns exporters write ----
def gelu_nodes(x, y, variant):
    if variant == 0:
        return [N("Div", [x, "sqrt2"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["e", "one"], ["a"]), N("Mul", [x, "a"], ["m"]), N("Mul", ["m", "half"], [y])]
    return [N("Mul", [x, "isqrt2"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["one", "e"], ["a"]), N("Mul", ["half", "a"], ["m"]), N("Mul", ["m", x], [y])]
for v in (0, 1):
    case(f"GELU erf pattern {v}", gelu_nodes("x", "y", v), {"x": randn(3, 7, scale=2)}, ["y"],
         inits={"sqrt2": f32(np.sqrt(2)), "isqrt2": f32(1 / np.sqrt(2)), "one": f32(1.0), "half": f32(0.5)}, consts={"sqrt2", "isqrt2", "one", "half"})
case("Erf alone", [N("Erf", ["x"], ["y"])], {"x": randn(3, 4)}, ["y"])
def attn_nodes(mask):
    ns = [N("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), N("Mul", ["q", "s1"], ["qs"]), N("Mul", ["kt", "s2"], ["kts"]), N("MatMul", ["qs", "kts"], ["sc"])]
    last = "sc"
    if mask: ns.append(N("Add", ["sc", "m"], ["scm"])); last = "scm"
    return ns + [N("Softmax", [last], ["p"], axis=-1), N("MatMul", ["p", "v"], ["y"])]
qkv = {"q": randn(2, 3, 5, 4), "k": randn(2, 3, 6, 4), "v": randn(2, 3, 6, 4)}
sc = {"s1": f32(0.5 ** 0.5), "s2": f32(0.5 ** 0.5)}
case("attention pattern", attn_nodes(False), qkv, ["y"], inits=sc)
mk = np.where(rng.random((2, 1, 1, 6)) > 0.3, 0, -np.inf).astype(np.float32); mk[..., 0] = 0
case("attention pattern, key padding mask", attn_nodes(True), {**qkv, "m": mk}, ["y"], inits=sc)
causal = np.where(np.tril(np.ones((5, 6))) > 0, 0, np.finfo(np.float32).min).astype(np.float32)
case("attention pattern, constant causal mask", attn_nodes(True), qkv, ["y"], inits={**sc, "m": causal})
case("attention pattern, full mask input", attn_nodes(True), {**qkv, "m": randn(2, 3, 5, 6)}, ["y"], inits=sc)

# ---- recurrent layers ----
for lbr in (0, 1):
    for bias, h0 in ((1, 1), (0, 0), (1, 0)):
        hid, inp, T, B = 4, 3, 5, 2
        ins = ["x", "w", "r"] + (["b"] if bias else [""]) + ["", "h0" if h0 else ""]
        while ins and ins[-1] == "": ins.pop()
        inits = {"w": randn(1, 3 * hid, inp, scale=0.5), "r": randn(1, 3 * hid, hid, scale=0.5)}
        if bias: inits["b"] = randn(1, 6 * hid, scale=0.5)
        inputs = {"x": randn(T, B, inp)}
        if h0: inputs["h0"] = randn(1, B, hid)
        case(f"GRU(lbr={lbr}, bias={bias}, h0={h0})", [N("GRU", ins, ["y", "yh"], hidden_size=hid, linear_before_reset=lbr)], inputs, ["y", "yh"], inits=inits)
for bias, st in ((1, 1), (0, 0)):
    hid, inp, T, B = 4, 3, 5, 2
    ins = ["x", "w", "r", "b" if bias else "", "", "h0" if st else "", "c0" if st else ""]
    while ins and ins[-1] == "": ins.pop()
    inits = {"w": randn(1, 4 * hid, inp, scale=0.5), "r": randn(1, 4 * hid, hid, scale=0.5)}
    if bias: inits["b"] = randn(1, 8 * hid, scale=0.5)
    inputs = {"x": randn(T, B, inp)}
    if st: inputs.update({"h0": randn(1, B, hid), "c0": randn(1, B, hid)})
    case(f"LSTM(bias={bias}, states={st})", [N("LSTM", ins, ["y", "yh", "yc"], hidden_size=hid)], inputs, ["y", "yh", "yc"], inits=inits)

# ---- RNN (forty-eighth session), each activation, every direction, layout 1 ----
for direction, D in (("forward", 1), ("reverse", 1), ("bidirectional", 2)):
    hid, inp, T, B = 4, 3, 5, 2
    for acts in (["Tanh"], ["Relu"], ["Sigmoid"]):
        acts = acts * D if direction != "bidirectional" else acts + ["Relu"]
        case(f"RNN({direction}, {acts})", [N("RNN", ["x", "w", "r", "b", "", "h0"], ["y", "yh"], hidden_size=hid, direction=direction, activations=acts)],
             {"x": randn(T, B, inp), "h0": randn(D, B, hid)}, ["y", "yh"], inits={"w": randn(D, hid, inp, scale=0.5), "r": randn(D, hid, hid, scale=0.5), "b": randn(D, 2 * hid, scale=0.5)})
    # (onnxruntime refuses layout=1 for RNN; tests/tract_interop.rs covers the layout on GRU)
    case(f"RNN({direction}, no bias, no state)", [N("RNN", ["x", "w", "r"], ["y", "yh"], hidden_size=hid, direction=direction)],
         {"x": randn(T, B, inp)}, ["y", "yh"], inits={"w": randn(D, hid, inp, scale=0.5), "r": randn(D, hid, hid, scale=0.5)})

# ---- reverse and bidirectional recurrences ----
for direction, D in (("reverse", 1), ("bidirectional", 2)):
    hid, inp, T, B = 4, 3, 5, 2
    for lbr in (0, 1):
        case(f"GRU({direction}, lbr={lbr})", [N("GRU", ["x", "w", "r", "b", "", "h0"], ["y", "yh"], hidden_size=hid, direction=direction, linear_before_reset=lbr)],
             {"x": randn(T, B, inp), "h0": randn(D, B, hid)}, ["y", "yh"], inits={"w": randn(D, 3 * hid, inp, scale=0.5), "r": randn(D, 3 * hid, hid, scale=0.5), "b": randn(D, 6 * hid, scale=0.5)})
    case(f"LSTM({direction})", [N("LSTM", ["x", "w", "r", "b", "", "h0", "c0"], ["y", "yh", "yc"], hidden_size=hid, direction=direction)],
         {"x": randn(T, B, inp), "h0": randn(D, B, hid), "c0": randn(D, B, hid)}, ["y", "yh", "yc"],
         inits={"w": randn(D, 4 * hid, inp, scale=0.5), "r": randn(D, 4 * hid, hid, scale=0.5), "b": randn(D, 8 * hid, scale=0.5)})
    case(f"LSTM({direction}, no bias, no states)", [N("LSTM", ["x", "w", "r"], ["y", "yh"], hidden_size=hid, direction=direction)],
         {"x": randn(T, B, inp)}, ["y", "yh"], inits={"w": randn(D, 4 * hid, inp, scale=0.5), "r": randn(D, 4 * hid, hid, scale=0.5)})

# ---- refusals the docs promise (exit 2, not a wrong answer) ----
# ---- operators written with other ops (import/composite.rs, import/resize.rs) ----
xs = randn(3, 4, 5, scale=2)
for op, kw, opset in [("LeakyRelu", {}, 16), ("LeakyRelu", {"alpha": 0.3}, 16), ("Elu", {}, 13), ("Elu", {"alpha": 0.5}, 13), ("Selu", {}, 13),
                      ("HardSigmoid", {}, 13), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 13), ("HardSwish", {}, 14), ("Mish", {}, 18), ("Softsign", {}, 13)]:
    case(f"{op}{kw}", [N(op, ["x"], ["y"], **kw)], {"x": xs}, ["y"], opset=opset)
    case(f"{op}{kw}/special", [N(op, ["x"], ["y"], **kw)], {"x": SPECIAL.reshape(3, 4)}, ["y"], opset=opset, grad=False)
for sshape in [(4, 1), (1,), (4, 5)]:
    case(f"PRelu(slope {sshape})", [N("PRelu", ["x", "s"], ["y"])], {"x": xs}, ["y"], inits={"s": randn(*sshape, scale=0.3)}, opset=16)
for op in ("ReduceL1", "ReduceL2", "ReduceSumSquare"):
    for kd in (0, 1):
        for axes in (None, [1], [0, -1]):
            if axes is None:
                case(f"{op}(all, keepdims={kd})", [N(op, ["x"], ["y"], keepdims=kd)], {"x": xs}, ["y"], opset=13)
            else:
                case(f"{op}(axes={axes}, keepdims={kd}) opset 13", [N(op, ["x"], ["y"], keepdims=kd, axes=axes)], {"x": xs}, ["y"], opset=13)
                case(f"{op}(axes={axes}, keepdims={kd}) opset 18", [N(op, ["x", "a"], ["y"], keepdims=kd)], {"x": xs}, ["y"], inits={"a": i64(*axes)}, opset=18)
for op in ("ReduceMax", "ReduceMin", "ReduceLogSumExp"):
    for kd in (0, 1):
        for axes in (None, [1], [0, -1], [2]):
            if axes is None:
                case(f"{op}(all, keepdims={kd})", [N(op, ["x"], ["y"], keepdims=kd)], {"x": xs}, ["y"], opset=13)
            else:
                case(f"{op}(axes={axes}, keepdims={kd}) opset 13", [N(op, ["x"], ["y"], keepdims=kd, axes=axes)], {"x": xs}, ["y"], opset=13)
                case(f"{op}(axes={axes}, keepdims={kd}) opset 18", [N(op, ["x", "a"], ["y"], keepdims=kd)], {"x": xs}, ["y"], inits={"a": i64(*axes)}, opset=18)
    case(f"{op}/special", [N(op, ["x"], ["y"], keepdims=0, axes=[1])], {"x": SPECIAL.reshape(3, 4)}, ["y"], opset=13, grad=False)
    case(f"{op}/long axis", [N(op, ["x"], ["y"], keepdims=0, axes=[1])], {"x": randn(3, 1000, scale=3)}, ["y"], opset=13)
case("GlobalMaxPool", [N("GlobalMaxPool", ["x"], ["y"])], {"x": randn(2, 3, 5, 7)}, ["y"])
for shape in [(2, 3, 5), (2, 3, 4, 5)]:
    case(f"InstanceNormalization{shape}", [N("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)], {"x": randn(*shape, scale=2)}, ["y"], inits={"s": randn(3), "b": randn(3)})
x_img = randn(2, 3, 5, 6)
for mode in ("nearest", "linear"):
    for ct in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        for sc in ((1, 1, 2, 2), (1, 1, 1.5, 0.5), (1, 1, 3, 1)):
            rules = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil") if mode == "nearest" else ("round_prefer_floor",)
            for rule in rules:
                case(f"Resize({mode}, {ct}, {rule}, scales={sc})", [N("Resize", ["x", "", "sc"], ["y"], mode=mode, coordinate_transformation_mode=ct, nearest_mode=rule)],
                     {"x": x_img}, ["y"], inits={"sc": f32(*sc)}, opset=13, consts={"sc"})
    case(f"Resize({mode}, sizes)", [N("Resize", ["x", "", "", "sz"], ["y"], mode=mode)], {"x": x_img}, ["y"], inits={"sz": i64(2, 3, 9, 4)}, opset=13)
    case(f"Resize({mode}, 3-D, opset 19)", [N("Resize", ["x", "", "sc"], ["y"], mode=mode, coordinate_transformation_mode="asymmetric")], {"x": randn(2, 3, 7)}, ["y"], inits={"sc": f32(1, 1, 2)}, opset=19, consts={"sc"})
    case(f"Resize({mode}, axes) opset 18", [N("Resize", ["x", "", "sc"], ["y"], mode=mode, axes=[2, 3])], {"x": x_img}, ["y"], inits={"sc": f32(2, 2)}, opset=18, consts={"sc"})
case("Resize(cubic)", [N("Resize", ["x", "", "sc"], ["y"], mode="cubic")], {"x": x_img}, ["y"], inits={"sc": f32(1, 1, 2, 2)}, opset=13, consts={"sc"})

# ---- sizes that take the SIMD, parallel and tiled kernel paths ----
case("large Gemm", [N("Gemm", ["x", "w", "b"], ["y"], transB=1)], {"x": randn(128, 300)}, ["y"], inits={"w": randn(257, 300, scale=0.1), "b": randn(257)}, rtol=1e-3, atol=1e-4)
case("large MatMul batched", [N("MatMul", ["a", "b"], ["y"])], {"a": randn(4, 70, 90), "b": randn(90, 66)}, ["y"], rtol=1e-3, atol=1e-4)
case("large Conv", [N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": randn(8, 16, 20, 20)}, ["y"], inits={"w": randn(32, 16, 3, 3, scale=0.1), "b": randn(32)}, rtol=1e-3, atol=1e-4)
case("large Conv stride 2 group 4", [N("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2], strides=[2, 2], group=4)], {"x": randn(4, 16, 17, 19)}, ["y"], inits={"w": randn(32, 4, 5, 5, scale=0.1)}, rtol=1e-3, atol=1e-4)
case("large MaxPool", [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": randn(8, 32, 24, 24)}, ["y"])
case("large AveragePool", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])], {"x": randn(8, 32, 24, 24)}, ["y"])
case("large LayerNormalization", [N("LayerNormalization", ["x", "s", "b"], ["y"])], {"x": randn(64, 512, scale=3)}, ["y"], inits={"s": randn(512), "b": randn(512)}, rtol=1e-3, atol=1e-4)
case("large Softmax", [N("Softmax", ["x"], ["y"], axis=-1)], {"x": randn(64, 1000, scale=5)}, ["y"])
case("large BatchNormalization+Relu", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["t"]), N("Relu", ["t"], ["y"])], {"x": randn(8, 32, 12, 12)}, ["y"],
     inits={"s": randn(32), "b": randn(32), "m": randn(32), "v": randn(32, lo=0.5)})
case("large Conv+BN+Relu", [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("BatchNormalization", ["c", "s", "b", "m", "v"], ["t"]), N("Relu", ["t"], ["y"])],
     {"x": randn(8, 8, 16, 16)}, ["y"], inits={"w": randn(16, 8, 3, 3, scale=0.2), "s": randn(16), "b": randn(16), "m": randn(16), "v": randn(16, lo=0.5)}, rtol=1e-3, atol=1e-4)
case("large Tanh/Sigmoid/Exp chain", [N("Tanh", ["x"], ["a"]), N("Sigmoid", ["a"], ["b"]), N("Exp", ["b"], ["y"])], {"x": randn(300, 257, scale=3)}, ["y"])
case("large attention pattern", attn_nodes(False), {"q": randn(2, 4, 64, 32), "k": randn(2, 4, 80, 32), "v": randn(2, 4, 80, 32)}, ["y"], inits={"s1": f32(32 ** -0.25), "s2": f32(32 ** -0.25)}, rtol=1e-3, atol=1e-4)

case("refuse: unknown op", [N("Hardmax", ["x"], ["y"])], {"x": randn(2, 3)}, ["y"], expect_refusal=True, grad=False)
case("refuse: opset 12 Softmax", [N("Softmax", ["x"], ["y"])], {"x": randn(2, 3)}, ["y"], opset=12, expect_refusal=True, grad=False)
case("refuse: unknown attribute", [N("Relu", ["x"], ["y"], mystery=1)], {"x": randn(2, 3)}, ["y"], expect_refusal=True, grad=False)

for j in JOBS: j.result()
print(f"\n{len(PASSED)} passed ({len(UNCHECKED)} with a gradient unchecked: a kink within every step tried), {len(FAILS)} disagreements, {len(REFUSED)} refused")
for r in UNCHECKED: print("  gradient unchecked:", " | ".join(r)[:300])
for r in REFUSED: print("  refused:", " | ".join(r)[:300])
shutil.rmtree(WORK, ignore_errors=True)
sys.exit(1 if FAILS else 0)
