"""Helpers shared by the oracle scripts (scripts/pytorch-oracle.py, scripts/onnx-oracle.py):
safetensors files without the safetensors package, and the comparison rule (NaN where the
reference has NaN, infinities equal, finite values within atol·(1 + max|ref|) + rtol·|ref|)."""
import json, struct
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

def read_st(path):
    with open(path, "rb") as f: data = f.read()
    n = struct.unpack("<Q", data[:8])[0]; header = json.loads(data[8:8 + n]); out = {}
    for k, v in header.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
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
