#!/bin/bash
# On the GPU machine (forty-ninth session): the forty-eighth session's audit models (about
# 700 PyTorch-exported ONNX models, TorchScript and dynamo exporters: whole architectures,
# every layer kind, losses; m.onnx + inputs + PyTorch's outputs and gradients + this build's
# checked_cpu result as the baseline, carried as gpu-bin/models.tgz) run under checked_cuda,
# then strict_native_cuda, each compared with the CPU baseline (and with PyTorch).
# Logs in $OUT/models-*.txt.
source "$(dirname "$0")/../gpu-session-start.sh"
mkdir -p /tmp/gz && tar xzf gpu-bin/models.tgz -C /tmp/gz
timeout ${1:-300} python3 scripts/model-cases-replay.py /tmp/gz/c --torchlean gpu-bin/torchlean \
  --profile checked_cuda --jobs 8 > $log/models-checked_cuda.txt 2>&1
echo "checked_cuda rc=$?"; tail -30 $log/models-checked_cuda.txt | cut -c1-600
timeout ${2:-200} python3 scripts/model-cases-replay.py /tmp/gz/c --torchlean gpu-bin/torchlean \
  --profile strict_native_cuda --jobs 8 > $log/models-strict_native_cuda.txt 2>&1
echo "strict_native_cuda rc=$?"; tail -12 $log/models-strict_native_cuda.txt | cut -c1-600
