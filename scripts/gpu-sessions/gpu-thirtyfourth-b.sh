#!/bin/bash
# On the GPU machine (thirty-fourth session, second run): the whole GPU test binary again
# (the recording-alone test's busy thread fixed), then tiny-ops and transformer-big-step
# beside PyTorch while time is left. DEADLINE seconds in all (default 300). Logs in
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run34b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-300}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 150 gpu-bin/gpu_only_conformance --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|busy thread ran" $log/tests.txt | cut -c1-200 | head -12
for r in 1 2; do
  [ $(left) -gt 60 ] || break
  timeout 40 gpu-bin/torchlean bench tiny-ops --device cuda --reps 20 --json > $log/tiny.q.$r.json 2>> $log/err
  timeout 40 python3 bench/pytorch/bench.py tiny-ops --device cuda --reps 20 > $log/tiny.pt.$r.json 2>> $log/err
  echo "tiny-ops round $r: queue $(field $log/tiny.q.$r.json median) PyTorch $(field $log/tiny.pt.$r.json median) us/op"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
