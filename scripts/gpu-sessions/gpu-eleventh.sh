#!/bin/bash
# On the GPU machine (eleventh session): the whole GPU conformance binary (every op's values
# and VJPs against the f64 spec on native_cuda, cublas and cufft; RNG bit-identity with the
# seed-hashed stream keys; the index kernels' checks at the next host read; one read per
# training step of an embedding model), then every example 20 steps on cuda, eager and
# compiled, against the CPU's losses (the random streams changed this session, so every
# model starts from new weights).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT (default /tmp/out).
set -u
cd "$(dirname "$0")/../.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REQUIRE_CUDA=1
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt
timeout 420 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|panicked|tests rc" $log/tests.txt | cut -c1-250
source "$(dirname "$0")/../gpu-examples.sh"
examples_against_cpu ${EXAMPLES:-quickstart-mlp quickstart-cnn mlp cnn transformer autoencoder fno1d rnn}
