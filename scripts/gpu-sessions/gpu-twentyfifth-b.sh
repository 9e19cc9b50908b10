#!/bin/bash
# On the GPU machine (twenty-fifth session, third run): multi-head attention's projections as
# three products on a device. The transformer example on cuda against the cpu (20 losses,
# both modes); transformer-big-step of this build against the previous one
# (gpu-bin/torchlean-prev) and PyTorch, alternating, two rounds (eager, flash attention),
# then compiled and torch.compile; per-capsule kernel times of this build. Logs packed into
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run25b; mkdir -p $log; cp $dest/gpu.txt $log/
source "$(dirname "$0")/../gpu-examples.sh"
examples_against_cpu transformer
big=transformer-big-step
for r in 1 2; do
  for b in torchlean torchlean-prev; do
    gpu-bin/$b bench $big --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.$b.$r.json 2> $log/big.$b.err
  done
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  echo "round $r eager: this $(field $log/big.torchlean.$r.json median), prev $(field $log/big.torchlean-prev.$r.json median), PyTorch $(field $log/big.pt.$r.json median) ms"
done
gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --backend compiled --reps 10 --json > $log/big.compiled.json 2> $log/big.compiled.err
python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.json 2>> $log/pt.err
echo "compiled: this $(field $log/big.compiled.json median), torch.compile $(field $log/big.ptc.json median) ms"
TORCHLEAN_OP_TIMES=1 gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 5 > $log/optimes.txt 2>&1
head -22 $log/optimes.txt | cut -c1-150
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
