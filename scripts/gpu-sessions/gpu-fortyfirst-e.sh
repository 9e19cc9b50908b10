#!/bin/bash
# On the GPU machine (forty-first session, the final kernel): the GPU conformance binary and
# one attention row beside PyTorch. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run41e; mkdir -p $log; cp $dest/gpu.txt $log/
gpu_tests 120
p="--device cuda --json"
pair attn-step-none 20 attn-step-none.det "" ""
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
