#!/bin/bash
# On the GPU machine (forty-second session): the final staged dQ kernel (0f29890 and later) — the GPU
# conformance binary, then the attention rows (deterministic, atomic, PyTorch) and
# transformer-big-step under `auto`, eager and compiled, beside PyTorch. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run42; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 240
base="--device cuda --json"
for w in attn-step-none attn-step-mask attn-step-causal; do
  p="$base"
  [ $(left) -gt 200 ] && pair $w 20 $w.det "" ""
  p="$base --allow-nondeterministic"
  [ $(left) -gt 180 ] && timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
p="$base"
[ $(left) -gt 120 ] && pair transformer-big-step 10 big.eager.auto "--backend eager" ""
[ $(left) -gt 80 ] && pair transformer-big-step 10 big.compiled.auto "--backend compiled" "--compile"
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
