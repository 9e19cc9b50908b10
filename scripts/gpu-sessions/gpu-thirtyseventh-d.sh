#!/bin/bash
# On the GPU machine (thirty-seventh session, the last device minutes): the GPU test binary
# on the session's CUDA change (the VJPs' selected zeros: relu, clamp, safe_log, pow 0,
# maximum/minimum's loser, fused chains — the conformance table's special-value rows hold
# them to the spec), then three examples against the CPU, then the attention figures while
# time is left. DEADLINE seconds (default 400). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run37d; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-400}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 200 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-300 | head -12
source scripts/gpu-examples.sh
[ $(left) -gt 200 ] && examples_against_cpu quickstart-mlp mlp transformer 2>&1 | tee $log/examples.txt
p="--device cuda --provider prefer:native_cuda --json"
for w in attn-step-none attn-fwd-none attn-step-mask attn-step-causal; do
  [ $(left) -gt 40 ] && pair $w 20 $w "" ""
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
