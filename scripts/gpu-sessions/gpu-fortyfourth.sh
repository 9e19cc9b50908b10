#!/bin/bash
# On the GPU machine (forty-fourth session, final binaries): the GPU conformance binary, then
# one alternating round of transformer-big-step (eager and compiled, beside PyTorch) and of
# the unmasked attention step, to see that the session's CUDA change (the norm kernels'
# x̂ = (x·sc − μ)·rstd) cost nothing measurable. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run44; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-300}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 120
p="--device cuda --json"
[ $(left) -gt 150 ] && pair transformer-big-step 10 big.eager.auto "--backend eager" ""
[ $(left) -gt 100 ] && pair transformer-big-step 10 big.compiled.auto "--backend compiled" "--compile"
[ $(left) -gt 50 ] && pair attn-step-none 20 attn-step-none.det "" ""
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
