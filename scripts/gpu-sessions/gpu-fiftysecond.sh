#!/bin/bash
# On the GPU machine (fifty-second session): the deterministic flash VJP's dQ added in
# key-tile order (the key kernel's ordered mode, turn counters per query tile). The GPU
# conformance binary first (its ordered-dQ test among them), then the attention rows —
# deterministic ordered (the new default), deterministic in slots as before
# (TORCHLEAN_FLASH_DQ_ORDERED=0), atomic, PyTorch — unmasked, causal and masked, then
# transformer-big-step eager and compiled beside PyTorch, then the attention memory at
# L = 2k, 8k, 32k. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run52; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 200
grep -E "ordered_dq|grouped_slots|flash_attention_matches|bit_identical" $log/tests.txt | cut -c1-400
base="--device cuda --json"
for w in attn-step-none attn-step-causal attn-step-mask; do
  p="$base"
  [ $(left) -gt 250 ] && pair $w 20 $w.det "" ""
  [ $(left) -gt 230 ] && TORCHLEAN_FLASH_DQ_ORDERED=0 timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.slots.tl.json 2>> $log/err \
    && echo "$w slots: torchlean $(field $log/$w.slots.tl.json median)"
  p="$base --allow-nondeterministic"
  [ $(left) -gt 220 ] && timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
p="$base"
[ $(left) -gt 140 ] && pair transformer-big-step 10 big.eager.auto "--backend eager" ""
[ $(left) -gt 100 ] && pair transformer-big-step 10 big.compiled.auto "--backend compiled" "--compile"
[ $(left) -gt 50 ] && attn_memory 2048 8192 32768
[ $(left) -gt 30 ] && pair attn-step-none 20 attn-step-none.det2 "" ""
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
