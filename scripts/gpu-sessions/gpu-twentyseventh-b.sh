#!/bin/bash
# On the GPU machine (twenty-seventh session, second run): the bench's training steps no
# longer read the loss mid-step (`TrainStep::run_queued`, as PyTorch's bench step), so the
# optimizer's launches queue behind the backward. The GPU conformance binary; then
# transformer-big-step (flash attention) eager and compiled for this build and the
# session-start build (gpu-bin/torchlean-base), PyTorch eager and torch.compile, alternating,
# two rounds; mlp-big-step and quickstart-step beside PyTorch; this build's per-capsule
# device times (TORCHLEAN_OP_TIMES=device). Binaries from scripts/gpu-check.sh (gpu-bin/);
# logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run27b; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
big=transformer-big-step
p="--device cuda --provider prefer:native_cuda --reps 10 --json"
for r in 1 2; do
  for b in torchlean torchlean-base; do
    gpu-bin/$b bench $big $p > $log/big.$b.e.$r.json 2> $log/big.err
    gpu-bin/$b bench $big $p --backend compiled > $log/big.$b.c.$r.json 2> $log/big.err
  done
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  echo "round $r: this eager $(field $log/big.torchlean.e.$r.json median) compiled $(field $log/big.torchlean.c.$r.json median); base eager $(field $log/big.torchlean-base.e.$r.json median) compiled $(field $log/big.torchlean-base.c.$r.json median); PyTorch eager $(field $log/big.pt.$r.json median), torch.compile $(field $log/big.ptc.$r.json median) ms"
done
for w in mlp-big-step quickstart-step; do
  for r in 1 2; do
    gpu-bin/torchlean bench $w --device cuda --reps 50 --json > $log/$w.this.$r.json 2> $log/w.err
    gpu-bin/torchlean-base bench $w --device cuda --reps 50 --json > $log/$w.base.$r.json 2> $log/w.err
    gpu-bin/torchlean bench $w --device cuda --reps 50 --backend compiled --json > $log/$w.thisc.$r.json 2> $log/w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 50 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$w round $r: this $(field $log/$w.this.$r.json median), compiled $(field $log/$w.thisc.$r.json median), base $(field $log/$w.base.$r.json median); PyTorch $(field $log/$w.pt.$r.json median)"
  done
done
TORCHLEAN_OP_TIMES=device gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 5 > $log/devtimes.txt 2>&1
grep -A22 "kernel time per capsule" $log/devtimes.txt | cut -c1-120
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
