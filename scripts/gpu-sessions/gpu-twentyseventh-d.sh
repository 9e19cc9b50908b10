#!/bin/bash
# On the GPU machine (twenty-seventh session, fourth run): causal forward blocks handed out
# heaviest first (the last query tiles, which see the most keys). The GPU conformance binary;
# then attn-fwd-causal and attn-step-causal (B=8 H=16 L=2048 D=64, and B=16 H=8 L=512) for
# this build and the session-start build (gpu-bin/torchlean-base) beside PyTorch's SDPA
# (is_causal), alternating, two rounds; the unmasked forward as a control. Binaries from
# scripts/gpu-check.sh (gpu-bin/); logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run27d; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
p="--device cuda --provider prefer:native_cuda --reps 20 --json"
for w in attn-fwd-causal attn-step-causal attn-fwd-causal-L512-B16 attn-step-causal-L512-B16 attn-fwd-none; do
  for r in 1 2; do
    gpu-bin/torchlean bench $w $p > $log/$w.this.$r.json 2> $log/w.err
    gpu-bin/torchlean-base bench $w $p > $log/$w.base.$r.json 2> $log/w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 20 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$w round $r: this $(field $log/$w.this.$r.json median), base $(field $log/$w.base.$r.json median); PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
tail -3 $log/w.err | cut -c1-300
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
