#!/bin/bash
# On the GPU machine (forty-ninth session): the ONNX oracle's cases (emitted here by
# `scripts/onnx-oracle.py --emit`, carried as gpu-bin/cases.tgz) replayed under checked_cuda —
# the import paths added since the twenty-fourth session's GPU run (RNN, GatherND, ScatterND,
# OneHot, cubic Resize, AveragePool's partial windows, …) lowered to CUDA kernels, against
# onnxruntime's values and finite differences. Log in $OUT/onnx-cuda.txt.
source "$(dirname "$0")/../gpu-session-start.sh"
mkdir -p /tmp/oc && tar xzf gpu-bin/cases.tgz -C /tmp/oc
timeout ${1:-540} python3 scripts/onnx-oracle-replay.py /tmp/oc/cases --torchlean gpu-bin/torchlean \
  --profiles ${2:-checked_cuda} --jobs ${3:-8} > $log/onnx-cuda.txt 2>&1
echo "replay rc=$?"
tail -25 $log/onnx-cuda.txt
