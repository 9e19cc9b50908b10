#!/bin/bash
# On the GPU machine (thirty-eighth session, final code): the GPU test binary — with
# `selected_zeros_stay_zero_under_infinite_cotangents_on_the_gpu`, which holds the CUDA VJPs'
# selected zeros (relu, clamp, safe_log, pow 0, maximum/minimum's loser, fused chains) to
# checked_cpu under infinite cotangents — then the examples against the CPU, then the figures
# of issues 11 and 12 beside PyTorch (one round) while time is left. DEADLINE seconds
# (default 560).
# Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run38; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 200 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-300 | head -12
source scripts/gpu-examples.sh
[ $(left) -gt 400 ] && examples_against_cpu quickstart-mlp mlp transformer cnn 2>&1 | tee $log/examples.txt
p="--device cuda --provider prefer:native_cuda --json"
for w in attn-fwd-none attn-step-none attn-fwd-mask attn-step-mask attn-fwd-causal attn-step-causal; do
  [ $(left) -gt 240 ] && pair $w 20 $w "" ""
done
[ $(left) -gt 200 ] && pair gemm-4096 20 gemm "" ""
[ $(left) -gt 180 ] && pair add-268435456 20 add "" ""
[ $(left) -gt 160 ] && pair mlp-big-step 50 mlpbig.eager "" ""
[ $(left) -gt 140 ] && pair mlp-big-step 50 mlpbig.compiled "--backend compiled" ""
[ $(left) -gt 120 ] && pair tiny-ops 20 tiny "" ""
[ $(left) -gt 100 ] && pair quickstart-step 50 qs.compiled "--backend compiled" ""
[ $(left) -gt 80 ] && pair transformer-big-step 10 big.eager "" ""
[ $(left) -gt 50 ] && pair transformer-big-step 10 big.compiled "--backend compiled" "--compile"
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
