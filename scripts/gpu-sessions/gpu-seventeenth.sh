#!/bin/bash
# On the GPU machine (seventeenth session): flash attention with the reworked split-TF32
# kernels. The GPU conformance binary with both tensor-core kernels on (TORCHLEAN_FLASH_MMA=1),
# then attn-{fwd,step}-{none,mask,causal} (`--provider prefer:native_cuda`) three ways,
# alternating: the default (tensor-core forward, f32 key/value VJP), both on tensor cores
# (=1), and PyTorch's SDPA; then transformer-big-step with `auto` (the composition), flash
# attention by default and flash attention with both kernels on tensor cores. Binaries from
# scripts/gpu-check.sh (gpu-bin/); env DEFAULT_TESTS (a test filter run with the default
# kernels first), TESTS, ROUNDS, BIG_ROUNDS, WORKLOADS, SKIP_BIG; logs
# under $OUT (only the lines printed here come back whole).
source "$(dirname "$0")/../gpu-session-start.sh"
if [ -n "${DEFAULT_TESTS:-}" ]; then
  # the default kernels (tensor-core forward, f32 key/value VJP)
  TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance $DEFAULT_TESTS --test-threads 1 --nocapture > $log/tests-default.txt 2>&1; echo "default tests rc=$?" >> $log/tests-default.txt
  grep -E "test result|panicked|tests rc|worst|FAILED" $log/tests-default.txt | cut -c1-300 | head -20
fi
TORCHLEAN_FLASH_MMA=1 TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance ${TESTS:-} --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|worst|error|registers|FAILED" $log/tests.txt | cut -c1-300 | head -40
gpu-bin/torchlean bench attn-fwd-none --device cuda --provider prefer:native_cuda --reps 3 --show-backend > $log/report.txt 2>&1
grep -iE "target" $log/report.txt | head -1 | cut -c1-400
for r in $(seq 1 ${ROUNDS:-2}); do
  for w in ${WORKLOADS:-attn-step-none attn-step-mask attn-step-causal}; do
    gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.def.$r.json 2> $log/$w.def.err
    TORCHLEAN_FLASH_MMA=1 gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.mma.$r.json 2> $log/$w.mma.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "round $r $w: default $(field $log/$w.def.$r.json median) ms, both mma $(field $log/$w.mma.$r.json median) ms, PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
if [ -z "${SKIP_BIG:-}" ]; then
  for r in $(seq 1 ${BIG_ROUNDS:-1}); do
    gpu-bin/torchlean bench transformer-big-step --device cuda --reps 10 --json > $log/big.auto.$r.json 2> $log/big.auto.err
    gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.flash.$r.json 2> $log/big.flash.err
    TORCHLEAN_FLASH_MMA=1 gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.mma.$r.json 2> $log/big.mma.err
    python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.$r.json 2> $log/big.pt.err
    echo "round $r transformer-big-step: auto $(field $log/big.auto.$r.json median) ms, flash $(field $log/big.flash.$r.json median) ms, flash both mma $(field $log/big.mma.$r.json median) ms, PyTorch $(field $log/big.pt.$r.json median) ms"
  done
fi
