#!/bin/bash
# On the GPU machine (twelfth session): the whole GPU conformance binary (the composed
# attention now scales the scores, not q), every PyTorch-exported ONNX fixture through
# `run-graph --grad` on cuda (the imported encoder's attention is now one
# scaled_dot_product_attention node with an additive mask: the composition under `auto`,
# the flash kernel under prefer:native_cuda), and transformer-big-step against PyTorch eager
# (the composition's extra scaling pass).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs and outputs under $OUT (default
# /tmp/out); the outputs are compared with PyTorch's stored ones on the development machine.
set -u
cd "$(dirname "$0")/../.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REQUIRE_CUDA=1
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 420 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
  grep -E "^test |test result|panicked|tests rc" $log/tests.txt | cut -c1-250
fi
fx=crates/torchlean-onnx/tests/fixtures
for m in ${MODELS:-mlp cnn encoder gru lstm embedding attention}; do
  for p in auto prefer:native_cuda; do
    tag=$m.$(echo $p | tr ':' '_')
    timeout 120 gpu-bin/torchlean run-graph $fx/$m.onnx --inputs $fx/$m.inputs.safetensors \
      --out $log/$tag.safetensors --grad --profile checked_cuda --provider $p \
      --report-json $log/$tag.report.json > $log/$tag.txt 2>&1
    echo "$tag: rc=$? $(grep -o '"[a-z_.]*attention[a-z_]*"' $log/$tag.report.json 2>/dev/null | sort -u | tr '\n' ' ')"
  done
done
if [ -z "${SKIP_BENCH:-}" ]; then
  field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])' "$1" "$2"; }
  for r in 1 2; do
    gpu-bin/torchlean bench transformer-big-step --device cuda --reps 5 --json > $log/tbs.tl.$r.json 2> $log/tbs.tl.err
    python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 5 > $log/tbs.pt.$r.json 2>> $log/tbs.pt.err
    echo "transformer-big-step round $r: torchlean $(field $log/tbs.tl.$r.json median) ms, PyTorch eager $(field $log/tbs.pt.$r.json median) ms"
  done
fi
