#!/bin/bash
# On the GPU machine (thirty-fifth session): the whole GPU test binary after the session's
# changes (compiled planning split into plan_graph, whole batches per epoch, checked
# user sizes), then every example against the CPU's losses, eager and compiled, while time
# is left. DEADLINE seconds in all (default 420). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run35; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-420}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 200 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-300 | head -12
source scripts/gpu-examples.sh
[ $(left) -gt 150 ] && examples_against_cpu quickstart-mlp mlp transformer cnn 2>&1 | tee $log/examples.txt
[ $(left) -gt 90 ] && examples_against_cpu rnn autoencoder fno1d 2>&1 | tee -a $log/examples.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
