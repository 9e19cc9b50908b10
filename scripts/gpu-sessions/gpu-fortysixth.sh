#!/bin/bash
# On the GPU machine (forty-sixth session): the GPU conformance binary (its table holds the
# forty-fifth session's `compare` rows and this session's `round` rows: every mode, ties,
# special values, the launch queue's sizes), then two PyTorch fixtures run on CUDA with
# --grad under checked_cuda and strict_native_cuda, outputs and gradients compared with
# PyTorch's stored values: `masked` (compare ops, boolean-mask attention) and `ranked`
# (top-k routing, sort, floor/ceil/round, a float-to-int cast: the round op). Logs in
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run46; mkdir -p $log; cp $dest/gpu.txt $log/
gpu_tests 240
F=crates/torchlean-onnx/tests/fixtures
for model in masked ranked; do
  for prof in checked_cuda strict_native_cuda; do
    timeout 60 gpu-bin/torchlean run-graph $F/$model.onnx --inputs $F/$model.inputs.safetensors \
      --out $log/$model.$prof.safetensors --grad --profile $prof --show-backend > $log/$model.$prof.txt 2>&1
    echo "$model under $prof: rc=$?"; grep -E "^(compare|round|argmax):" $log/$model.$prof.txt | head -3
  done
done
python3 scripts/compare-fixture-outputs.py $log 2>&1 | tail -6
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
