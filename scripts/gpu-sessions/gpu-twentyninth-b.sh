#!/bin/bash
# On the GPU machine (twenty-ninth session, second run): the GPU conformance binary (flash_flags
# fixed for NVRTC, adam_step's kernels), then transformer-big-step eager and compiled for this
# build (Adam's step as one adam_step launch) and the session-start build (gpu-bin/torchlean-base)
# beside PyTorch eager and torch.compile, then the attention workloads (flash_flags) this/base/
# PyTorch, then a second transformer round if time is left (DEADLINE seconds in all, default
# 330; TESTS: a test-name filter). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run29b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-330}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout $((D / 3)) gpu-bin/gpu_only_conformance --test-threads 1 ${TESTS:-} > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|tests rc" $log/tests.txt | cut -c1-120 | head -40
big() {
  local r=$1 p="--device cuda --provider prefer:native_cuda --reps 10 --json"
  for b in torchlean torchlean-base; do
    timeout 60 gpu-bin/$b bench transformer-big-step $p > $log/big.$b.eager.$r.json 2> $log/big.err
    timeout 60 gpu-bin/$b bench transformer-big-step $p --backend compiled > $log/big.$b.compiled.$r.json 2>> $log/big.err
  done
  timeout 60 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  [ $(left) -gt 90 ] && timeout 110 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  echo "transformer-big-step round $r: eager this $(field $log/big.torchlean.eager.$r.json median) base $(field $log/big.torchlean-base.eager.$r.json median) PyTorch $(field $log/big.pt.$r.json median); compiled this $(field $log/big.torchlean.compiled.$r.json median) base $(field $log/big.torchlean-base.compiled.$r.json median) torch.compile $(field $log/big.ptc.$r.json median) ms"
}
big 1
p="--device cuda --provider prefer:native_cuda --reps 20 --json"
for w in attn-step-causal-L512-B16 attn-step-none attn-fwd-causal-L512-B16 attn-step-causal attn-step-mask; do
  [ $(left) -gt 25 ] || break
  gpu-bin/torchlean bench $w $p > $log/$w.this.json 2> $log/w.err
  gpu-bin/torchlean-base bench $w $p > $log/$w.base.json 2>> $log/w.err
  python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.json 2>> $log/pt.err
  echo "$w: this $(field $log/$w.this.json median), base $(field $log/$w.base.json median); PyTorch $(field $log/$w.pt.json median) ms"
done
[ $(left) -gt 200 ] && big 2
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
