#!/bin/bash
# On the GPU machine (forty-first session, final code): the GPU conformance binary (now with
# the atomic flash VJP in the conformance table too), then scripts/gpu-attention.sh (the
# transformer example under auto = deterministic flash, the atomic opt-in, the composition
# and strict_native_cuda, eager and compiled, beside the CPU's losses). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run41c; mkdir -p $log; cp $dest/gpu.txt $log/
gpu_tests 240
OUT=$log timeout 300 bash scripts/gpu-attention.sh > /dev/null 2>&1; cat $log/attention.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
