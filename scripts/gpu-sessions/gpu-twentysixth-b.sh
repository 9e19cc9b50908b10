#!/bin/bash
# On the GPU machine (twenty-sixth session, last run): the GPU conformance binary; the
# examples on cuda against the cpu (20 losses, eager and compiled); transformer-big-step
# side by side — this build (flash attention) eager and compiled, the session-start build
# (gpu-bin/torchlean-base), PyTorch eager and torch.compile — alternating, two rounds; then
# this build's per-capsule kernel times (TORCHLEAN_OP_TIMES: synchronized, for ranking).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run26; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED|flash_attention_matches" $log/tests.txt | cut -c1-300 | head -20
source "$(dirname "$0")/../gpu-examples.sh"
examples_against_cpu quickstart-mlp mlp transformer
big=transformer-big-step
for r in 1 2; do
  gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.this.$r.json 2> $log/big.this.err
  gpu-bin/torchlean-base bench $big --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.base.$r.json 2> $log/big.base.err
  gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --backend compiled --reps 10 --json > $log/big.compiled.$r.json 2> $log/big.compiled.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  echo "round $r: eager this $(field $log/big.this.$r.json median), base $(field $log/big.base.$r.json median), compiled $(field $log/big.compiled.$r.json median); PyTorch eager $(field $log/big.pt.$r.json median), torch.compile $(field $log/big.ptc.$r.json median) ms"
done
grep -m1 -o '"peak_bytes":[0-9]*' $log/big.this.1.json
TORCHLEAN_OP_TIMES=1 gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 5 > $log/optimes.txt 2>&1
head -24 $log/optimes.txt | cut -c1-150
grep -m1 "^target" $log/optimes.txt | cut -c1-400
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
