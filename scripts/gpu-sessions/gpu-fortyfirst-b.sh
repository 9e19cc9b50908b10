#!/bin/bash
# On the GPU machine (forty-first session, after gpu-fortyfirst.sh): the transformer example
# on cuda with flash attention under `auto` (now the deterministic capsule), `prefer:native_cuda`
# and strict_native_cuda (its replayed twin), eager and compiled, beside the CPU's losses
# (scripts/gpu-attention.sh); then a second round of the attention rows, deterministic and
# atomic beside PyTorch. DEADLINE seconds (default 560). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run41b; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
OUT=$log timeout 300 bash scripts/gpu-attention.sh > /dev/null 2>&1; cat $log/attention.txt
base="--device cuda --json"
for w in attn-step-none attn-step-mask attn-step-causal attn-fwd-none; do
  p="$base --provider prefer:native_cuda"
  [ $(left) -gt 60 ] && pair $w 20 $w.det "" ""
  p="$base --allow-nondeterministic"
  [ $(left) -gt 40 ] && timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
