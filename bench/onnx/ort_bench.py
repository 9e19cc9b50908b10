#!/usr/bin/env python3
"""Times onnxruntime's CPU inference of an ONNX model (2 intra-op threads, as torchlean uses
2 cores here) on deterministic inputs of the model's declared shapes; prints JSON.

    python3 bench/onnx/ort_bench.py MODEL.onnx [--reps N] [--threads T]
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort

args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 20
threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 2
path = args[0]
opts = ort.SessionOptions()
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(7)
feed = {i.name: rng.uniform(-1, 1, size=i.shape).astype(np.float32) for i in sess.get_inputs()}
start = time.perf_counter()
while time.perf_counter() - start < 0.5:
    sess.run(None, feed)
times = []
for _ in range(reps):
    t = time.perf_counter()
    sess.run(None, feed)
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"engine": "onnxruntime " + ort.__version__, "threads": threads, "model": path,
                  "median": times[len(times) // 2] * 1e3, "min": times[0] * 1e3, "unit": "ms"}))
