#!/bin/bash
# On the GPU machine (sixteenth session): flash attention's forward with its products on
# tensor cores in split-TF32 (flash_forward_mma). The GPU conformance binary, then
# attn-{fwd,step}-{none,mask,causal} with flash attention planned (`--provider
# prefer:native_cuda`): gpu-bin/torchlean with the tensor-core kernels (TORCHLEAN_FLASH_MMA=1),
# the same binary with TORCHLEAN_FLASH_MMA=0 (the f32 FMA kernels), and PyTorch's SDPA, alternating, three rounds;
# then transformer-big-step with `auto` (the composition) and with flash attention on tensor cores. Binaries
# from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
TORCHLEAN_FLASH_MMA=1 TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance ${TESTS:-} --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|worst|error|registers" $log/tests.txt | cut -c1-300 | head -40
TORCHLEAN_FLASH_MMA=1 gpu-bin/torchlean bench attn-fwd-none --device cuda --provider prefer:native_cuda --reps 3 --show-backend > $log/report.txt 2>&1
grep -iE "target|flash" $log/report.txt | head -5 | cut -c1-400
for r in $(seq 1 ${ROUNDS:-3}); do
  for w in ${WORKLOADS:-attn-fwd-none attn-fwd-mask attn-fwd-causal attn-step-none attn-step-mask attn-step-causal}; do
    TORCHLEAN_FLASH_MMA=1 gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.mma.$r.json 2> $log/$w.mma.err
    TORCHLEAN_FLASH_MMA=0 gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.fma.$r.json 2> $log/$w.fma.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "round $r $w: mma $(field $log/$w.mma.$r.json median) ms, fma $(field $log/$w.fma.$r.json median) ms, PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
if [ -z "${SKIP_BIG:-}" ]; then
  for r in $(seq 1 ${BIG_ROUNDS:-2}); do
    gpu-bin/torchlean bench transformer-big-step --device cuda --reps 10 --json > $log/big.auto.$r.json 2> $log/big.auto.err
    TORCHLEAN_FLASH_MMA=1 gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.flash.$r.json 2> $log/big.flash.err
    echo "round $r transformer-big-step: auto $(field $log/big.auto.$r.json median) ms, flash $(field $log/big.flash.$r.json median) ms"
  done
fi
