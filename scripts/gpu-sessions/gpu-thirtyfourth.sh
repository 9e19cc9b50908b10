#!/bin/bash
# On the GPU machine (thirty-fourth session): the whole GPU test binary (with this session's
# recording-runs-alone test and pow's special values on the GPU), tiny-ops with and without
# the launch queue beside PyTorch, every example against the CPU's losses in both modes, and
# transformer-big-step eager and compiled beside PyTorch eager and torch.compile while time
# is left. DEADLINE seconds in all (default 420). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run34; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-420}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 150 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|busy thread ran" $log/tests.txt | cut -c1-200 | head -12
for w in tiny-ops tiny-ops-tape; do
  timeout 40 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.q.json 2>> $log/err
  TORCHLEAN_LAUNCH_QUEUE=0 timeout 40 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.noq.json 2>> $log/err
  timeout 40 python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.json 2>> $log/err
  echo "$w: queue $(field $log/$w.q.json median) no queue $(field $log/$w.noq.json median) PyTorch $(field $log/$w.pt.json median) us/op"
done
source scripts/gpu-examples.sh
[ $(left) -gt 150 ] && examples_against_cpu quickstart-mlp mlp transformer quickstart-cnn cnn autoencoder fno1d rnn 2>&1 | tee $log/examples.txt
big() {
  local r=$1 p="--device cuda --provider prefer:native_cuda --reps 10 --json"
  timeout 60 gpu-bin/torchlean bench transformer-big-step $p > $log/big.eager.$r.json 2> $log/big.err
  timeout 60 gpu-bin/torchlean bench transformer-big-step $p --backend compiled > $log/big.compiled.$r.json 2>> $log/big.err
  timeout 60 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/err
  [ $(left) -gt 60 ] && timeout 110 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/err
  echo "transformer-big-step round $r: eager this $(field $log/big.eager.$r.json median) PyTorch $(field $log/big.pt.$r.json median); compiled this $(field $log/big.compiled.$r.json median) torch.compile $(field $log/big.ptc.$r.json median) ms"
}
[ $(left) -gt 150 ] && big 1
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
