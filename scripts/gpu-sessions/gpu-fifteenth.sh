#!/bin/bash
# On the GPU machine (fifteenth session): the CUDA flash kernels skip the tiles a boolean mask
# blocks entirely (entry points `*_tiles`; the others are compiled without the tile test).
# The GPU conformance binary (the flash test draws structured masks: causal pattern, diagonal
# blocks, key padding), then attn-{fwd,step}-{none,mask,causal} with flash attention planned
# (`--provider prefer:native_cuda`): gpu-bin/torchlean beside gpu-bin/torchlean-base (the
# commit before the tiles, when present) and PyTorch's SDPA, alternating, three rounds.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|worst" $log/tests.txt | cut -c1-200
for r in 1 2 3; do
  for w in attn-fwd-none attn-fwd-mask attn-fwd-causal attn-step-none attn-step-mask attn-step-causal; do
    line="round $r $w:"
    for b in torchlean-base torchlean; do
      [ -x gpu-bin/$b ] || continue
      gpu-bin/$b bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.$b.$r.json 2> $log/$w.$b.err
      line="$line $b $(field $log/$w.$b.$r.json median) ms,"
    done
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "$line PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
