#!/usr/bin/env python3
"""Compares `run-graph --grad` outputs (safetensors) with PyTorch's stored ones for the ONNX
fixtures, as tests/pytorch_fixtures.rs does (max |difference| against 2e-5 x the reference's
scale). Needs only numpy (the safetensors format is read directly).

    python3 scripts/compare-fixture-outputs.py OUTPUT_DIR   # files MODEL.TAG.safetensors
"""
import json, os, struct, sys
import numpy as np

def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64, "F64": np.float64}[info["dtype"]]
        out[name] = np.frombuffer(data[lo:hi], dtype=dt).reshape(info["shape"])
    return out

fixtures = os.path.join(os.path.dirname(__file__), "..", "crates/torchlean-onnx/tests/fixtures")
bad = 0
for f in sorted(os.listdir(sys.argv[1])):
    if not f.endswith(".safetensors"):
        continue
    model = f.split(".")[0]
    got = read(os.path.join(sys.argv[1], f))
    want = read(os.path.join(fixtures, model + ".expected.safetensors"))
    worst = 0.0
    for name, w in want.items():
        if name not in got:
            print(f"{f}: no output `{name}`"); bad += 1; continue
        w = w.astype(np.float64); g = got[name].astype(np.float64)
        scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        err = float(np.abs(g - w).max()) / scale if w.size else 0.0
        worst = max(worst, err)
        if not err <= 2e-5:
            print(f"{f}: `{name}` off by {err:.2e} of scale"); bad += 1
    print(f"{f}: {len(want)} values, worst {worst:.2e} of scale")
sys.exit(1 if bad else 0)
