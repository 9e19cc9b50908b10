#!/bin/bash
# On the GPU machine (thirty-ninth session): the flash VJP's key kernel with its last wave
# split along the queries (src/kernels/attention_split.rs). The GPU test binary first (its
# flash tests now take the split on most unmasked, non-causal calls: few batch matrices on
# many SMs), then issue 12's unmasked forward + backward at B=8 H=16 L=2048 D=64 with the
# split off (TORCHLEAN_FLASH_SPLIT=0) and on, alternating, beside PyTorch's SDPA, then the
# other attention figures and L = 1984 / 2112. DEADLINE seconds (default 560; 150: tests
# only). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run39; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 200 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc|registers" $log/tests.txt | cut -c1-300 | head -16
gpu-bin/torchlean plan --profile checked_cuda --ops linear --show-backend 2>&1 | grep -o "flash attention:.*" | cut -c1-400 > $log/target.txt
p="--device cuda --provider prefer:native_cuda --json"
for r in 1 2 3; do
  [ $(left) -gt 200 ] && TORCHLEAN_FLASH_SPLIT=0 pair attn-step-none 20 off.$r "" ""
  [ $(left) -gt 200 ] && pair attn-step-none 20 on.$r "" ""
done
for w in attn-step-none-B1 attn-step-none-L1984 attn-step-none-L2112 attn-fwd-none attn-step-mask attn-step-causal; do
  [ $(left) -gt 60 ] && pair $w 20 $w "" ""
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
