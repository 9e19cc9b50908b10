#!/usr/bin/env python3
"""Replays the cases `scripts/onnx-oracle.py --emit DIR` wrote (models, inputs, onnxruntime's
outputs and finite differences) with `torchlean run-graph` under the given profiles, on a
machine that has numpy but not onnx or onnxruntime — the GPU machine:

    python3 scripts/onnx-oracle.py --emit cases/            # here
    python3 scripts/onnx-oracle-replay.py cases/ --torchlean gpu-bin/torchlean --profiles checked_cuda,strict_native_cuda

Prints every disagreement and refusal; exits 1 if there is a disagreement.
"""
import argparse, concurrent.futures, os, shlex, shutil, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import load_case, judge_run

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("cases")
ap.add_argument("--torchlean", default="target/release/torchlean")
ap.add_argument("--profiles", default="checked_cpu")
ap.add_argument("--extra", default="")
ap.add_argument("--jobs", type=int, default=4)
ARGS = ap.parse_args()

def one(d, prof):
    meta, want, fd = load_case(d)
    work = tempfile.mkdtemp()
    for f in ("m.onnx", "in.st"):
        shutil.copy(os.path.join(d, f), work)
    verdict = judge_run(ARGS.torchlean, work, prof, shlex.split(ARGS.extra), meta, want, fd)
    shutil.rmtree(work, ignore_errors=True)
    return meta["label"], prof, verdict, meta.get("fd_skipped", [])

cases = sorted(os.path.join(ARGS.cases, c) for c in os.listdir(ARGS.cases))
counts = {"pass": 0, "refused": 0, "fail": 0}
unchecked = []  # passed cases with an input whose gradient no finite difference could check
with concurrent.futures.ThreadPoolExecutor(ARGS.jobs) as pool:
    for label, prof, (kind, msg), skipped in pool.map(lambda a: one(*a), [(d, p) for d in cases for p in ARGS.profiles.split(",")]):
        counts[kind] += 1
        if kind == "pass" and skipped:
            unchecked.append(f"{label} | {prof} | {', '.join(skipped)}")
        if kind != "pass":
            print(f"{'disagreement' if kind == 'fail' else 'refused'}: {label} | {prof} | {msg}"[:700], flush=True)
print(f"\n{counts['pass']} passed ({len(unchecked)} with a gradient unchecked: a kink within every step tried), {counts['fail']} disagreements, {counts['refused']} refused")
for u in unchecked: print("  gradient unchecked:", u[:300])
sys.exit(1 if counts["fail"] else 0)
