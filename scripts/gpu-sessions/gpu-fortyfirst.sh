#!/bin/bash
# On the GPU machine (forty-first session): the GPU conformance binary (the flash capsule's
# VJP now deterministic, the atomic one opt-in: both against the spec, and the deterministic
# one bit-identical over runs), then flash attention's deterministic VJP against the atomic
# one and PyTorch's SDPA, then the transformer step under `auto` (which now plans the
# deterministic flash capsule) against the composition (`prefer:torchlean`), the atomic
# opt-in and PyTorch, then the transformer example's 20 losses against the CPU's.
# DEADLINE seconds (default 560). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run41; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
gpu_tests 200
base="--device cuda --json"
for w in attn-step-none attn-step-mask attn-step-causal; do
  p="$base --provider prefer:native_cuda"
  [ $(left) -gt 300 ] && pair $w 20 $w.det "" ""
  p="$base --provider prefer:native_cuda --allow-nondeterministic"
  [ $(left) -gt 290 ] && timeout 90 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
for m in eager compiled; do
  pt=""; [ $m = compiled ] && pt="--compile"
  p="$base"
  [ $(left) -gt 200 ] && pair transformer-big-step 10 big.$m.auto "--backend $m" "$pt"
  p="$base --provider prefer:torchlean"
  [ $(left) -gt 170 ] && timeout 90 gpu-bin/torchlean bench transformer-big-step $p --reps 10 --backend $m > $log/big.$m.composition.tl.json 2>> $log/err \
    && echo "big.$m composition: torchlean $(field $log/big.$m.composition.tl.json median)"
  p="$base --allow-nondeterministic"
  [ $(left) -gt 140 ] && timeout 90 gpu-bin/torchlean bench transformer-big-step $p --reps 10 --backend $m > $log/big.$m.atomic.tl.json 2>> $log/err \
    && echo "big.$m atomic: torchlean $(field $log/big.$m.atomic.tl.json median)"
done
source scripts/gpu-examples.sh
[ $(left) -gt 60 ] && examples_against_cpu transformer 2>&1 | tee $log/examples.txt
grep -h "scaled_dot_product_attention" $log/transformer.*.txt 2>/dev/null | sort | uniq -c | head -4
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
