#!/bin/bash
# On the GPU machine: the flash kernels of gpu-bin/torchlean against gpu-bin/torchlean-base
# (another commit's build, e.g. the parent of a kernel change) on the unmasked and causal
# attention workloads, alternating, three rounds (fifteenth session: it showed that testing
# the tile words in every kernel slowed the unmasked forward by 18%). Binaries from
# scripts/gpu-check.sh; prints one median per run.
set -u
cd "$(dirname "$0")/.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d[sys.argv[2]],3))' "$1" "$2"; }
for r in 1 2 3; do
  for w in attn-fwd-none attn-fwd-causal attn-step-none; do
    for b in torchlean-base torchlean; do
      gpu-bin/$b bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > /tmp/ab.json 2>/dev/null
      echo "round $r $w $b: $(field /tmp/ab.json median) ms"
    done
  done
done
