#!/bin/bash
# On the GPU machine (fortieth session, after gpu-fortieth.sh on an H200): issue 11's rows
# beside PyTorch 2.11 (and torch.compile for the compiled transformer), then every example's
# 20 losses on the GPU against the CPU's. DEADLINE seconds (default 560). Logs in
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run40b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
p="--device cuda --provider prefer:native_cuda --json"
[ $(left) -gt 400 ] && pair gemm-4096 20 gemm "" ""
[ $(left) -gt 380 ] && pair add-268435456 20 add "" ""
[ $(left) -gt 360 ] && pair mlp-big-step 50 mlpbig.eager "" ""
[ $(left) -gt 340 ] && pair tiny-ops 20 tiny "" ""
[ $(left) -gt 320 ] && pair quickstart-step 50 qs.compiled "--backend compiled" ""
[ $(left) -gt 300 ] && pair transformer-big-step 10 big.eager "" ""
[ $(left) -gt 260 ] && pair transformer-big-step 10 big.compiled "--backend compiled" "--compile"
source scripts/gpu-examples.sh
[ $(left) -gt 150 ] && examples_against_cpu quickstart-mlp mlp transformer cnn 2>&1 | tee $log/examples.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
