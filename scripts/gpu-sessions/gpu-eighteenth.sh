#!/bin/bash
# On the GPU machine (eighteenth session): the flash kernels' exponentials on the special-
# function unit directly (ex2.approx.ftz) and the unmasked forward's whole key tiles without
# per-entry tests. The GPU conformance binary with the default kernels (filter $TESTS), then
# attn-{fwd,step}-{none,mask,causal} (`--provider prefer:native_cuda`) three ways,
# alternating: this build, the build of the parent commit (gpu-bin/torchlean-base, when
# present) and PyTorch's SDPA; then transformer-big-step (flash attention) against PyTorch.
# Binaries from scripts/gpu-check.sh (gpu-bin/); env TESTS, ROUNDS, WORKLOADS, SKIP_BIG;
# logs under $OUT (only the lines printed here come back whole).
source "$(dirname "$0")/../gpu-session-start.sh"
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance ${TESTS:-} --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|worst|FAILED" $log/tests.txt | cut -c1-300 | head -30
gpu-bin/torchlean bench attn-fwd-none --device cuda --provider prefer:native_cuda --reps 3 --show-backend > $log/report.txt 2>&1
grep -iE "target|flash" $log/report.txt | head -3 | cut -c1-400
base=gpu-bin/torchlean-base
for r in $(seq 1 ${ROUNDS:-2}); do
  for w in ${WORKLOADS:-attn-fwd-none attn-fwd-mask attn-fwd-causal attn-step-none attn-step-mask attn-step-causal}; do
    gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.new.$r.json 2> $log/$w.new.err
    [ -x $base ] && $base bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.base.$r.json 2> $log/$w.base.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "round $r $w: this build $(field $log/$w.new.$r.json median) ms, parent $(field $log/$w.base.$r.json median) ms, PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
if [ -z "${SKIP_BIG:-}" ]; then
  gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.flash.json 2> $log/big.flash.err
  python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.json 2> $log/big.pt.err
  echo "transformer-big-step: flash $(field $log/big.flash.json median) ms, PyTorch $(field $log/big.pt.json median) ms"
fi
