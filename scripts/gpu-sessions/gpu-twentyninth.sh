#!/bin/bash
# On the GPU machine (twenty-ninth session, first run): the flash_flags change measured
# (scripts/gpu-sessions/gpu-twentyseventh-e.sh: GPU conformance, causal/masked/unmasked attention and
# transformer-big-step eager, this build against gpu-bin/torchlean-base beside PyTorch), then
# tiny-ops (issue 11: eager per-op time ≤ 0.5× PyTorch's), three alternating rounds.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs in $OUT/e/logs.tgz and $OUT/tiny.
here="$(dirname "$0")"
OUT_ROOT=${OUT:-/tmp/out}
OUT=$OUT_ROOT/e bash "$here/gpu-twentyseventh-e.sh"
source "$here/../gpu-session-start.sh" > /dev/null
log=$OUT_ROOT/tiny; mkdir -p $log
for r in 1 2 3; do
  gpu-bin/torchlean bench tiny-ops --device cuda --reps 10 --json > $log/this.$r.json 2> $log/err
  gpu-bin/torchlean-base bench tiny-ops --device cuda --reps 10 --json > $log/base.$r.json 2>> $log/err
  python3 bench/pytorch/bench.py tiny-ops --device cuda --reps 10 > $log/pt.$r.json 2>> $log/pt.err
  echo "tiny-ops round $r: this $(field $log/this.$r.json median), base $(field $log/base.$r.json median); PyTorch $(field $log/pt.$r.json median)"
done
