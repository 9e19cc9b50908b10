"""Helpers shared by the oracle scripts (scripts/pytorch-oracle.py, scripts/onnx-oracle.py):
safetensors files without the safetensors package, and the comparison rule (NaN where the
reference has NaN, infinities equal, finite values within atol·(1 + max|ref|) + rtol·|ref|)."""
import re, json, os, struct, subprocess
import numpy as np

def write_st(path, tensors):
    header, off, blobs = {}, 0, []
    for k, v in tensors.items():
        b = np.ascontiguousarray(v, dtype=np.float32).tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h); [f.write(b) for b in blobs]

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_, "U8": np.uint8, "F16": np.float16}

def read_st(path):
    with open(path, "rb") as f: data = f.read()
    n = struct.unpack("<Q", data[:8])[0]; header = json.loads(data[8:8 + n]); out = {}
    for k, v in header.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return out

def close(a, b, rtol, atol):
    a = np.asarray(a, np.float64); b = np.asarray(b, np.float64)
    if a.shape != b.shape: return f"shape {a.shape} vs {b.shape}"
    na, nb = np.isnan(a), np.isnan(b)
    if (na != nb).any():
        i = np.argwhere(na != nb)[0]; return f"NaN mismatch at {tuple(i)}: got {a[tuple(i)]}, ref {b[tuple(i)]}"
    ia, ib = np.isinf(a), np.isinf(b)
    fin = ~(na | ia | ib)
    if ((ia | ib) & ~na & (a != b)).any():
        i = np.argwhere((ia | ib) & (a != b))[0]; return f"inf mismatch at {tuple(i)}: got {a[tuple(i)]}, ref {b[tuple(i)]}"
    scale = np.abs(b[fin]).max() if fin.any() else 0
    with np.errstate(invalid="ignore"): err = np.abs(a - b)[fin]
    bad = err > atol * (1 + scale) + rtol * np.abs(b[fin])
    if bad.any():
        j = np.argmax(err - (atol * (1 + scale) + rtol * np.abs(b[fin])))
        idx = tuple(np.argwhere(fin)[j])
        return f"value at {idx}: got {a[idx]!r}, ref {b[idx]!r} (max err {err.max():.3g}, scale {scale:.3g})"
    return None


def save_case(d, meta, want, fd):
    """Stores a case's expectations beside its model and inputs: meta.json, want.npz (the
    reference outputs) and fd.npz (per differentiable value, its direction u and the
    reference's directional derivative)."""
    meta = dict(meta, fd_f32=bool(fd.get("_f32", False)), fd=[k for k in fd if not k.startswith("_")],
                fd_skipped=list(fd.get("_skipped", [])))
    json.dump(meta, open(os.path.join(d, "meta.json"), "w"))
    np.savez(os.path.join(d, "want.npz"), **want)
    np.savez(os.path.join(d, "fd.npz"), **{f"u.{k}": v[0] for k, v in fd.items() if not k.startswith("_")},
             **{f"d.{k}": np.array(v[1]) for k, v in fd.items() if not k.startswith("_")})

def load_case(d):
    meta = json.load(open(os.path.join(d, "meta.json")))
    want = dict(np.load(os.path.join(d, "want.npz")))
    z = np.load(os.path.join(d, "fd.npz"))
    fd = {"_f32": meta["fd_f32"]} if meta["fd"] else {}
    for k in meta["fd"]:
        fd[k] = (z[f"u.{k}"], float(z[f"d.{k}"]))
    return meta, want, fd

def judge_run(torchlean, work, prof, extra, meta, want, fd):
    """Runs `work/m.onnx` on `work/in.st` under `prof` and judges the result against the
    reference outputs `want` and the directional derivatives `fd`: ("pass", None),
    ("refused", reason) for a refusal (exit 2), or ("fail", what)."""
    cmd = [torchlean, "run-graph", f"{work}/m.onnx", "--inputs", f"{work}/in.st", "--out", f"{work}/out.st", "--profile", prof] + extra + (["--grad"] if meta["grad"] else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().replace("\n", " | ")[-500:]
        if meta["expect_error"] and p.returncode == 1 and meta["expect_error"] in msg:
            return ("pass", None)
        if p.returncode == 2:
            return ("pass", None) if meta["expect_refusal"] else ("refused", msg)
        return ("fail", f"exit {p.returncode}: {msg}")
    if meta["expect_refusal"]:
        return ("fail", "expected a refusal, but it ran")
    out = read_st(f"{work}/out.st")
    for y, v in want.items():
        if y not in out: return ("fail", f"no output {y} (got {sorted(out)})")
        msg = close(out[y], v, meta["rtol"], meta["atol"])
        if msg: return ("fail", f"{y}: " + msg)
    if fd:
        tol = 2e-2 if fd["_f32"] else 2e-3
        for name, val in fd.items():
            if name.startswith("_"): continue
            u, want_d = val
            key = f"grad.{name}"
            if key not in out:
                # no differentiable path (a parameter read only by comparisons): torchlean
                # writes no gradient and says so; PyTorch's is None, the differences' zero
                said = re.search(r"does not depend differentiably on (.*?) \(no gradient", p.stderr)
                said = said is not None and name in said.group(1).split(", ")
                if said and abs(want_d) <= 1e-5: continue
                return ("fail", f"no {key} (got {sorted(out)})")
            g = out[key].astype(np.float64)
            if g.shape != u.shape: return ("fail", f"{key} shape {g.shape}, input {u.shape}")
            got = float((g * u).sum()); mag = float(np.abs(g * u).sum())
            if not abs(got - want_d) <= tol * max(mag, abs(want_d)) + 1e-5:
                return ("fail", f"{key}·u = {got:.7g}, finite differences {want_d:.7g} (Σ|g·u| {mag:.3g})")
    return ("pass", None)
