#!/bin/bash
# On the GPU machine (fifty-third session): the deterministic flash VJP's ordered dQ, now
# descending key tiles in every case (a lower-triangular boolean mask waited like an
# ascending causal cut) and on by default. The GPU conformance binary first, then the
# attention rows — deterministic by default (ordered) beside PyTorch, the slots
# (TORCHLEAN_FLASH_DQ_ORDERED=0), atomic — unmasked, causal and masked, then
# transformer-big-step eager and compiled beside PyTorch, then the attention memory at
# L = 2k, 8k, 32k. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run53; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 170
grep -E "ordered_dq|grouped_slots|flash_attention_matches|bit_identical" $log/tests.txt | cut -c1-400
base="--device cuda --json"
for w in attn-step-none attn-step-causal attn-step-mask; do
  p="$base"
  [ $(left) -gt 250 ] && pair $w 20 $w.det "" ""
  [ $(left) -gt 230 ] && TORCHLEAN_FLASH_DQ_ORDERED=0 solo $w 20 $w.slots
  p="$base --allow-nondeterministic"
  [ $(left) -gt 220 ] && solo $w 20 $w.atomic
done
p="$base"
[ $(left) -gt 140 ] && pair transformer-big-step 10 big.eager "--backend eager" ""
[ $(left) -gt 100 ] && pair transformer-big-step 10 big.compiled "--backend compiled" "--compile"
[ $(left) -gt 50 ] && attn_memory 2048 8192 32768
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
