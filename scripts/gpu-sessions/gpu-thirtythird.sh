#!/bin/bash
# On the GPU machine (thirty-third session): the launch queue (src/queue.rs) — the whole GPU
# test binary (its new queued_maps_give_the_direct_launches_bits included), tiny-ops with the
# queue, without it (TORCHLEAN_LAUNCH_QUEUE=0) and PyTorch side by side, the examples with
# small maps against the CPU in both modes, the quickstart step, one transformer-big-step
# round, then the flash VJP's two key kernels beside PyTorch while time is left. DEADLINE
# seconds in all (default 420). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run33; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-420}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 150 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|queued_maps" $log/tests.txt | cut -c1-200 | head -20
tiny() {
  local r=$1 w
  for w in tiny-ops tiny-ops-tape; do
    timeout 60 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.q.$r.json 2>> $log/err
    TORCHLEAN_LAUNCH_QUEUE=0 timeout 60 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.noq.$r.json 2>> $log/err
    timeout 60 python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.$r.json 2>> $log/err
    echo "$w round $r: queue $(field $log/$w.q.$r.json median) no queue $(field $log/$w.noq.$r.json median) PyTorch $(field $log/$w.pt.$r.json median) us/op"
  done
}
tiny 1
source scripts/gpu-examples.sh
[ $(left) -gt 200 ] && examples_against_cpu quickstart-mlp mlp transformer rnn 2>&1 | tee $log/examples.txt
for m in eager compiled; do
  timeout 60 gpu-bin/torchlean bench quickstart-step --device cuda --backend $m --reps 200 --json > $log/qs.$m.json 2>> $log/err
done
timeout 60 python3 bench/pytorch/bench.py quickstart-step --device cuda --reps 200 > $log/qs.pt.json 2>> $log/err
echo "quickstart-step: eager $(field $log/qs.eager.json median) compiled $(field $log/qs.compiled.json median) PyTorch eager $(field $log/qs.pt.json median) ms"
tiny 2
if [ $(left) -gt 120 ]; then
  p="--device cuda --provider prefer:native_cuda --reps 10 --json"
  timeout 60 gpu-bin/torchlean bench transformer-big-step $p > $log/big.eager.json 2>> $log/err
  timeout 60 python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.json 2>> $log/err
  echo "transformer-big-step eager: this $(field $log/big.eager.json median) PyTorch $(field $log/big.pt.json median) ms"
fi
tiny 3
p="--device cuda --provider prefer:native_cuda --reps 10 --json"
for w in attn-step-none attn-step-causal; do
  [ $(left) -gt 40 ] || break
  timeout 30 gpu-bin/torchlean bench $w $p > $log/$w.f32.json 2>> $log/err
  TORCHLEAN_FLASH_MMA=1 timeout 30 gpu-bin/torchlean bench $w $p > $log/$w.mma.json 2>> $log/err
  timeout 30 python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.json 2>> $log/err
  echo "$w: f32 VJP $(field $log/$w.f32.json median) tensor-core VJP $(field $log/$w.mma.json median) PyTorch $(field $log/$w.pt.json median) ms"
done
tail -3 $log/err
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
