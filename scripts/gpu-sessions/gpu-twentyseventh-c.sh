#!/bin/bash
# On the GPU machine (twenty-seventh session, third run): a compiled step's inputs and
# parameters copied into its device graph's static buffers by one launch (`copy_many`,
# kernel `copy_segments`) instead of one copy per parameter. The GPU conformance binary; the
# examples on cuda against the cpu (20 losses, eager and compiled); transformer-big-step eager
# and compiled for this build and the session-start build (gpu-bin/torchlean-base), PyTorch
# eager and torch.compile, alternating, two rounds; quickstart-step and mlp-big-step compiled
# beside the base build and PyTorch eager. Binaries from scripts/gpu-check.sh (gpu-bin/); logs
# packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run27c; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
source "$(dirname "$0")/../gpu-examples.sh"
examples_against_cpu quickstart-mlp mlp transformer
big=transformer-big-step
p="--device cuda --provider prefer:native_cuda --reps 10 --json"
for r in 1 2; do
  gpu-bin/torchlean bench $big $p > $log/big.this.e.$r.json 2> $log/big.err
  gpu-bin/torchlean bench $big $p --backend compiled > $log/big.this.c.$r.json 2> $log/big.err
  gpu-bin/torchlean-base bench $big $p --backend compiled > $log/big.base.c.$r.json 2> $log/big.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  echo "round $r: this eager $(field $log/big.this.e.$r.json median) compiled $(field $log/big.this.c.$r.json median); base compiled $(field $log/big.base.c.$r.json median); PyTorch eager $(field $log/big.pt.$r.json median), torch.compile $(field $log/big.ptc.$r.json median) ms"
done
grep -o '"executor":"[^"]*"' $log/big.this.c.1.json | head -1 | cut -c1-300
for w in quickstart-step mlp-big-step; do
  for r in 1 2; do
    gpu-bin/torchlean bench $w --device cuda --reps 50 --backend compiled --json > $log/$w.this.$r.json 2> $log/w.err
    gpu-bin/torchlean-base bench $w --device cuda --reps 50 --backend compiled --json > $log/$w.base.$r.json 2> $log/w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 50 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$w compiled round $r: this $(field $log/$w.this.$r.json median), base $(field $log/$w.base.$r.json median); PyTorch eager $(field $log/$w.pt.$r.json median) ms"
  done
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
