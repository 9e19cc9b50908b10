#!/bin/bash
# On the GPU machine (eleventh session): the whole GPU conformance binary (every op's values
# and VJPs against the f64 spec on native_cuda, cublas and cufft; RNG bit-identity with the
# seed-hashed stream keys; the index kernels' checks at the next host read; one read per
# training step of an embedding model), then every example 20 steps on cuda, eager and
# compiled, against the CPU's losses (the random streams changed this session, so every
# model starts from new weights).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT (default /tmp/out).
set -u
cd "$(dirname "$0")/.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REQUIRE_CUDA=1
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt
timeout 420 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|panicked|tests rc" $log/tests.txt | cut -c1-250
for ex in ${EXAMPLES:-quickstart-mlp quickstart-cnn mlp cnn transformer autoencoder fno1d rnn}; do
  timeout 120 gpu-bin/torchlean $ex --steps 20 --log-every 1 --device cpu > $log/$ex.cpu.txt 2>&1
  for m in eager compiled; do
    timeout 120 gpu-bin/torchlean $ex --steps 20 --log-every 1 --device cuda --backend $m > $log/$ex.$m.txt 2>&1; rc=$?
    if [ $rc -ne 0 ]; then echo "$ex $m rc=$rc: $(tail -c 300 $log/$ex.$m.txt | tr '\n' ' ')"; continue; fi
    paste <(grep -o "loss [0-9.]*" $log/$ex.cpu.txt | head -20) <(grep -o "loss [0-9.]*" $log/$ex.$m.txt | head -20) \
      | awk -v n="$ex $m" '{d=$2-$4; if (d<0) d=-d; r=d/($2>1e-9?$2:1); if (r>w) w=r} END {printf "%s: %d losses, worst relative difference to the CPU %.2e\n", n, NR, w}'
  done
done
