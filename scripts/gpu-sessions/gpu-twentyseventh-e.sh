#!/bin/bash
# On the GPU machine (twenty-seventh session, last run): flash attention's flags from one
# pass over each tensor (`flash_flags`: finiteness and the split-TF32 bound together, one
# launch for every tensor of a call) instead of one scan per tensor and flag. The GPU
# conformance binary; then the causal, masked and unmasked attention workloads (B=8 H=16
# L=2048 D=64; causal also B=16 L=512) for this build and the session-start build
# (gpu-bin/torchlean-base) beside PyTorch's SDPA, alternating, two rounds; transformer-big-step
# eager for both builds. Binaries from scripts/gpu-check.sh (gpu-bin/); logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run27e; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
p="--device cuda --provider prefer:native_cuda --reps 20 --json"
for w in attn-fwd-causal attn-step-causal attn-fwd-causal-L512-B16 attn-step-causal-L512-B16 attn-step-mask attn-step-none; do
  for r in 1 2; do
    gpu-bin/torchlean bench $w $p > $log/$w.this.$r.json 2> $log/w.err
    gpu-bin/torchlean-base bench $w $p > $log/$w.base.$r.json 2> $log/w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$w round $r: this $(field $log/$w.this.$r.json median), base $(field $log/$w.base.$r.json median); PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
for r in 1 2; do
  for b in torchlean torchlean-base; do
    gpu-bin/$b bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.$b.$r.json 2> $log/w.err
  done
  echo "transformer-big-step eager round $r: this $(field $log/big.torchlean.$r.json median), base $(field $log/big.torchlean-base.$r.json median) ms"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
