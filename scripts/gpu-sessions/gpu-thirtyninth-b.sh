#!/bin/bash
# On the GPU machine (thirty-ninth session, final code): the GPU test binary (the CUDA
# gradients now in PyTorch's order of operations: div, log, safe_log, sqrt; mse's target
# gradient; the norms without a shift), every example against the CPU's losses, then issue
# 12's unmasked forward + backward (three rounds beside PyTorch's SDPA, the split priced by
# its scratch) and issue 11's figures while time is left. DEADLINE seconds (default 560;
# 150: tests only). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run39b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 200
source scripts/gpu-examples.sh
[ $(left) -gt 400 ] && examples_against_cpu quickstart-mlp mlp transformer cnn 2>&1 | tee $log/examples.txt
p="--device cuda --provider prefer:native_cuda --json"
for r in 1 2 3; do
  [ $(left) -gt 200 ] && pair attn-step-none 20 step.$r "" ""
done
[ $(left) -gt 180 ] && pair gemm-4096 20 gemm "" ""
[ $(left) -gt 160 ] && pair mlp-big-step 50 mlpbig.eager "" ""
[ $(left) -gt 130 ] && pair tiny-ops 20 tiny "" ""
[ $(left) -gt 110 ] && pair quickstart-step 50 qs.compiled "--backend compiled" ""
[ $(left) -gt 80 ] && pair transformer-big-step 10 big.eager "" ""
[ $(left) -gt 50 ] && pair transformer-big-step 10 big.compiled "--backend compiled" "--compile"
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
