#!/bin/bash
# On the GPU machine (fifty-third session), with little device time: the flash tests, then
# the masked attention row (what the descending order changed) beside PyTorch and the
# slots, then the unmasked and causal rows beside PyTorch. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run53s; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-240}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 120 gpu-bin/gpu_only_conformance --test-threads 1 flash > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|ordered_dq|bit_identical" $log/tests.txt | cut -c1-300 | head -12
p="--device cuda --json"
for w in attn-step-mask attn-step-none attn-step-causal; do
  [ $(left) -gt 40 ] && pair $w 20 $w.det "" ""
  [ $w = attn-step-mask ] && [ $(left) -gt 30 ] && TORCHLEAN_FLASH_DQ_ORDERED=0 solo $w 20 $w.slots
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
