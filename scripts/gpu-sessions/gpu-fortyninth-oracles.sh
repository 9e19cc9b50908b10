#!/bin/bash
# On the GPU machine (forty-ninth session, after the coalesced broadcast geometries): both
# oracles again — the ONNX oracle's emitted cases (gpu-bin/cases.tgz, folder cases2) under
# checked_cuda, and PyTorch as every op's oracle under checked_cuda. Logs in $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
mkdir -p /tmp/oc && tar xzf gpu-bin/cases.tgz -C /tmp/oc
timeout ${1:-200} python3 scripts/onnx-oracle-replay.py /tmp/oc/cases2 --torchlean gpu-bin/torchlean \
  --profiles checked_cuda --jobs 8 > $log/onnx-cuda.txt 2>&1
echo "onnx replay rc=$?"; tail -6 $log/onnx-cuda.txt | cut -c1-400
timeout ${2:-200} python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean \
  --profiles checked_cuda --jobs 8 > $log/ops.txt 2>&1
echo "ops rc=$?"; tail -6 $log/ops.txt | cut -c1-400
