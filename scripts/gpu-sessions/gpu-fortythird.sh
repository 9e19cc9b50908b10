#!/bin/bash
# On the GPU machine (forty-third session): deterministic dQ in slots (a22a7a4) and the huge-bias
# attention fix — the GPU conformance binary, then the attention rows (deterministic with
# slots, deterministic by the query kernel as before: TORCHLEAN_FLASH_DQ_SLOTS=0, atomic,
# PyTorch), transformer-big-step under `auto` eager and compiled beside PyTorch, and the
# attention memory at L = 2k, 8k, 32k. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run43; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 200
grep -E "grouped_slots|flash_attention_matches|bit_identical" $log/tests.txt | cut -c1-300
base="--device cuda --json"
for w in attn-step-none attn-step-mask attn-step-causal; do
  p="$base"
  [ $(left) -gt 220 ] && pair $w 20 $w.det "" ""
  [ $(left) -gt 200 ] && TORCHLEAN_FLASH_DQ_SLOTS=0 timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.query.tl.json 2>> $log/err \
    && echo "$w query kernel: torchlean $(field $log/$w.query.tl.json median)"
  p="$base --allow-nondeterministic"
  [ $(left) -gt 190 ] && timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
p="$base"
[ $(left) -gt 130 ] && pair transformer-big-step 10 big.eager.auto "--backend eager" ""
[ $(left) -gt 90 ] && pair transformer-big-step 10 big.compiled.auto "--backend compiled" "--compile"
[ $(left) -gt 40 ] && attn_memory 2048 8192 32768
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
