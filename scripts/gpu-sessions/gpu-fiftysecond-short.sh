#!/bin/bash
# On the GPU machine (fifty-second session), when little device time is left: the GPU tests
# whose names hold `flash` (the ordered-dQ test among them), then the unmasked and causal
# attention steps — deterministic as by default (slots), ordered (TORCHLEAN_FLASH_DQ_ORDERED=1),
# atomic, PyTorch. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run52s; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-300}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 150 gpu-bin/gpu_only_conformance flash --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |FAIL|panicked|test result|tests rc|ordered_dq" $log/tests.txt | cut -c1-300 | head -30
base="--device cuda --json"
for w in attn-step-none attn-step-causal; do
  p="$base"
  [ $(left) -gt 60 ] && TORCHLEAN_FLASH_DQ_ORDERED=1 timeout 60 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.ordered.tl.json 2>> $log/err \
    && echo "$w ordered: torchlean $(field $log/$w.ordered.tl.json median)"
  [ $(left) -gt 50 ] && pair $w 20 $w.det "" ""
  p="$base --allow-nondeterministic"
  [ $(left) -gt 30 ] && timeout 60 gpu-bin/torchlean bench $w $p --reps 20 > $log/$w.atomic.tl.json 2>> $log/err \
    && echo "$w atomic: torchlean $(field $log/$w.atomic.tl.json median)"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
