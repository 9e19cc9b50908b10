#!/bin/bash
# On the GPU machine (thirty-third session, third run; meant for the H200 the issue names):
# the whole GPU test binary with the launch queue, every example against the CPU's losses in
# both modes, and tiny-ops with and without the queue beside PyTorch. DEADLINE seconds in all
# (default 300). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run33c; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-300}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 120 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-200 | head -10
for w in tiny-ops tiny-ops-tape; do
  timeout 40 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.q.json 2>> $log/err
  TORCHLEAN_LAUNCH_QUEUE=0 timeout 40 gpu-bin/torchlean bench $w --device cuda --reps 20 --json > $log/$w.noq.json 2>> $log/err
  timeout 40 python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.json 2>> $log/err
  echo "$w: queue $(field $log/$w.q.json median) no queue $(field $log/$w.noq.json median) PyTorch $(field $log/$w.pt.json median) us/op"
done
source scripts/gpu-examples.sh
[ $(left) -gt 120 ] && examples_against_cpu quickstart-mlp mlp transformer quickstart-cnn cnn autoencoder fno1d rnn 2>&1 | tee $log/examples.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
