#!/bin/bash
# On the GPU machine (fortieth session): the card decides. On an H200 (the card of issues 11
# and 12): the GPU conformance binary, then issue 12's attention rows beside PyTorch 2.11's
# SDPA (B=8 H=16 L=2048 D=64: unmasked and masked, forward and forward + backward, causal),
# then flash attention's memory at L = 2k, 8k, 32k. On another card: the conformance binary
# only (the figures of that card are in docs/cuda.md already). DEADLINE seconds (default
# 560). Logs in $OUT/logs.tgz; issue 11's rows are gpu-fortieth-b.sh.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run40; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 220
if grep -q H200 $log/gpu.txt; then
  p="--device cuda --provider prefer:native_cuda --json"
  for w in attn-step-none attn-fwd-none attn-step-mask attn-fwd-mask attn-step-none attn-step-causal attn-fwd-causal; do
    [ $(left) -gt 90 ] && pair $w 20 $w.$(ls $log | grep -c "^$w\.") "" ""
  done
  [ $(left) -gt 60 ] && attn_memory 2048 8192 32768
fi
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
