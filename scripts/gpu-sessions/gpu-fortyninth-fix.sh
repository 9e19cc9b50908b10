#!/bin/bash
# On the GPU machine (forty-ninth session, after the fixes): the GPU conformance suite, then
# the audit models (gpu-bin/models.tgz: all but the five largest) under checked_cuda and
# strict_native_cuda against this build's CPU baseline — GQA's rank-10 broadcast_to (coalesced
# axes, rank limit 16) and nll_loss with class weights (an unrequested gradient no longer
# reaches the replay checker) among them. Logs in $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 200
mkdir -p /tmp/gz && tar xzf gpu-bin/models.tgz -C /tmp/gz
for p in checked_cuda strict_native_cuda; do
  timeout ${1:-150} python3 scripts/model-cases-replay.py /tmp/gz/c --torchlean gpu-bin/torchlean \
    --profile $p --jobs 8 > $log/models-$p.txt 2>&1
  echo "$p rc=$?"; grep -v "^refused" $log/models-$p.txt | cut -c1-500 | tail -8
done
