#!/bin/bash
# On the GPU machine (thirty-third session, second run): the LibTorch bundle (built here by
# scripts/libtorch-gpu-check.sh against PyTorch 2.11; carry libtorch-bin/) — its capsule tests
# on the CPU and CUDA and the transformer under both libtorch profiles, eager and compiled,
# for the first time since the twelfth session — then, while time is left, the whole GPU test
# binary of gpu-bin/ again on this machine. DEADLINE seconds in all (default 330). Logs in
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run33b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-330}; left() { echo $(( D - ($(date +%s) - start) )); }
OUT=$log/libtorch timeout $(( D - 90 )) bash libtorch-bin/run.sh 2>&1 | tee $log/libtorch.txt | grep -vE "^test .* ok$" | head -60
if [ $(left) -gt 70 ]; then
  TORCHLEAN_REQUIRE_CUDA=1 timeout $(( $(left) - 10 )) gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
  grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-200 | head -10
fi
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
