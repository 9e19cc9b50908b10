#!/bin/bash
# On the GPU machine (thirty-fourth session, third run): the whole GPU test binary with the
# norms' overflow rescue and attention at head dimension 0 on the GPU, then every example
# against the CPU's losses while time is left. DEADLINE seconds in all (default 300). Logs
# in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run34c; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-300}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 150 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|busy thread ran" $log/tests.txt | cut -c1-300 | head -12
source scripts/gpu-examples.sh
[ $(left) -gt 120 ] && examples_against_cpu quickstart-mlp mlp transformer cnn rnn 2>&1 | tee $log/examples.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
