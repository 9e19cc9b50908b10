#!/usr/bin/env python3
"""Replays saved model cases — folders holding `m.onnx` (a PyTorch-exported model with a
`loss` output), `in.safetensors` (its inputs) and `ref.safetensors` (PyTorch's outputs and
gradients, `grad.NAME`) — with `torchlean run-graph --grad` under one profile, on a machine
that has numpy but neither PyTorch's exporter nor onnxruntime (the GPU machine).

    python3 scripts/model-cases-replay.py CASES --profile checked_cpu --baseline   # here: writes CASE/base.safetensors
    python3 scripts/model-cases-replay.py CASES --torchlean gpu-bin/torchlean --profile checked_cuda

Each result is compared with the baseline run (`base.safetensors`, another device's or
profile's result of the same binary: what a device must reproduce) and with PyTorch's
(`ref.safetensors`, informative: documented deviations such as gradients at kinks show up
there on every device). Prints each case that differs from its baseline, or was refused or
failed where the baseline ran; exits 1 if one differs.
"""
import argparse, concurrent.futures, os, shutil, subprocess, sys, tempfile
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import close, read_st

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("cases")
ap.add_argument("--torchlean", default="target/release/torchlean")
ap.add_argument("--profile", default="checked_cpu")
ap.add_argument("--baseline", action="store_true", help="write each case's result as its baseline (base.safetensors) instead of comparing")
ap.add_argument("--jobs", type=int, default=4)
ap.add_argument("--rtol", type=float, default=1e-4)
ap.add_argument("--atol", type=float, default=1e-5)
ARGS = ap.parse_args()

def differences(got, want):
    bad = []
    for k, v in want.items():
        if k not in got:
            bad.append(f"missing {k}")
            continue
        m = close(got[k].astype(np.float64), v.astype(np.float64), ARGS.rtol, ARGS.atol)
        if m: bad.append(f"{k}: {m}")
    return bad

def one(case):
    work = tempfile.mkdtemp()
    out = os.path.join(work, "out.safetensors")
    cmd = [ARGS.torchlean, "run-graph", os.path.join(case, "m.onnx"), "--inputs", os.path.join(case, "in.safetensors"), "--out", out, "--grad", "--profile", ARGS.profile]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return case, "hang", "no result in 300 s"
    base = os.path.join(case, "base.safetensors")
    if p.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        if ARGS.baseline and os.path.exists(base):
            os.remove(base)  # no stale baseline from an earlier run
        ran_before = os.path.exists(base)
        kind = ("refused" if p.returncode == 2 else f"exit {p.returncode}") + (" (the baseline ran)" if ran_before else "")
        return case, kind, (p.stderr or p.stdout).strip().replace("\n", " | ")[-400:]
    if ARGS.baseline:
        shutil.copy(out, base)
        shutil.rmtree(work, ignore_errors=True)
        vs_ref = differences(read_st(base), read_st(os.path.join(case, "ref.safetensors")))
        return case, "baseline", "; ".join(vs_ref)[:400]
    got = read_st(out)
    shutil.rmtree(work, ignore_errors=True)
    vs_ref = differences(got, read_st(os.path.join(case, "ref.safetensors")))
    if not os.path.exists(base):
        return case, "ran, no baseline", "; ".join(vs_ref)[:400]
    vs_base = differences(got, read_st(base))
    if vs_base:
        return case, "differs from the baseline", "; ".join(vs_base)[:400] + (" | vs PyTorch: " + "; ".join(vs_ref)[:300] if vs_ref else " | agrees with PyTorch")
    return case, "agrees", ""

def name(case):
    f = os.path.join(case, "name")
    return open(f).read().strip() if os.path.exists(f) else os.path.basename(case)

cases = sorted(os.path.join(ARGS.cases, c) for c in os.listdir(ARGS.cases) if os.path.exists(os.path.join(ARGS.cases, c, "m.onnx")))
counts = {}
with concurrent.futures.ThreadPoolExecutor(ARGS.jobs) as pool:
    for case, kind, msg in pool.map(one, cases):
        counts[kind] = counts.get(kind, 0) + 1
        if kind not in ("agrees", "baseline") or (ARGS.baseline and msg):
            print(f"{kind}: {name(case)} | {msg}" if msg else f"{kind}: {name(case)}", flush=True)
print("\n" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" ({len(cases)} cases, {ARGS.profile})")
sys.exit(1 if counts.get("differs from the baseline") or counts.get("hang") or any(k.endswith("(the baseline ran)") for k in counts) else 0)
