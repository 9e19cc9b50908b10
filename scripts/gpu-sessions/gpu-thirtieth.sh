#!/bin/bash
# On the GPU machine (thirtieth session, first run): the whole GPU test binary (last session's
# two failures were test expectations, fixed but not re-run there), then transformer-big-step
# eager and compiled beside PyTorch eager and torch.compile (rounds while time is left), the
# step's device time by kernel (TORCHLEAN_OP_TIMES=device), and tiny-ops beside PyTorch.
# DEADLINE seconds in all (default 330). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run30; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-330}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout $((D / 3)) gpu-bin/gpu_only_conformance --test-threads 1 ${TESTS:-} > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|tests rc" $log/tests.txt | cut -c1-120 | head -40
tiny() {
  local r=$1
  for w in tiny-ops tiny-ops-tape; do
    gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.this.$r.json 2>> $log/w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$w round $r: this $(field $log/$w.this.$r.json median) PyTorch $(field $log/$w.pt.$r.json median) us/op"
  done
}
big() {
  local r=$1 p="--device cuda --provider prefer:native_cuda --reps 10 --json"
  timeout 60 gpu-bin/torchlean bench transformer-big-step $p > $log/big.eager.$r.json 2> $log/big.err
  timeout 60 gpu-bin/torchlean bench transformer-big-step $p --backend compiled > $log/big.compiled.$r.json 2>> $log/big.err
  timeout 60 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  [ $(left) -gt 60 ] && timeout 110 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  echo "transformer-big-step round $r: eager this $(field $log/big.eager.$r.json median) PyTorch $(field $log/big.pt.$r.json median); compiled this $(field $log/big.compiled.$r.json median) torch.compile $(field $log/big.ptc.$r.json median) ms"
}
tiny 1
big 1
TORCHLEAN_OP_TIMES=device timeout 60 gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 > $log/big.events.txt 2>&1
head -40 $log/big.events.txt
tiny 2
[ $(left) -gt 100 ] && big 2
[ $(left) -gt 100 ] && big 3
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
