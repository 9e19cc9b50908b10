#!/usr/bin/env bash
# On the GPU machine (issue 12): the transformer example trained on cuda with the default plan
# (`auto`: native_cuda.flash_attention, deterministic, since the forty-first session), with
# the atomic flash VJP (`--allow-nondeterministic`), with the composition
# (`--provider prefer:torchlean`), and under strict_native_cuda (the replayed flash capsule),
# in both execution modes, each beside the CPU's losses; the attention row of each run's
# backend report. Logs to $OUT (or gpu-logs/).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-gpu-logs}; mkdir -p "$log"
export TORCHLEAN_REQUIRE_CUDA=1 TORCHLEAN_CACHE_DIR=${TORCHLEAN_CACHE_DIR:-/tmp/torchlean-cache}
tl=gpu-bin/torchlean
steps=60
losses() { grep '^step' "$1" | awk '{print $2, $4}'; }
for mode in eager compiled; do
  $tl transformer --backend $mode --steps $steps > "$log/tr-cpu-$mode.txt" 2>&1
  for variant in "auto|" "atomic|--allow-nondeterministic" "composition|--provider prefer:torchlean" "strict|--profile strict_native_cuda"; do
    IFS='|' read -r name flags <<< "$variant"
    out="$log/tr-cuda-$name-$mode.txt"
    if [ "$name" = strict ]; then dev=""; else dev="--device cuda"; fi
    $tl transformer --backend $mode --steps $steps $dev $flags --show-backend > "$out" 2>&1; rc=$?
    # the steps both runs logged, joined by step number
    worst=$(join <(losses "$log/tr-cpu-$mode.txt" | sort -k1,1) <(losses "$out" | sort -k1,1) | awk '{d=$2-$3; if (d<0) d=-d; if (d>m) m=d} END {printf "%.2e", m}')
    row=$(grep -m1 '^scaled_dot_product_attention:' "$out" | cut -d' ' -f2)
    echo "transformer --backend $mode [$name $flags]: exit $rc, attention ran $row, $(losses "$out" | wc -l) logged steps, last loss $(losses "$out" | tail -1 | cut -d' ' -f2) (cpu $(losses "$log/tr-cpu-$mode.txt" | tail -1 | cut -d' ' -f2)), largest |loss - cpu loss| $worst" | tee -a "$log/attention.txt"
  done
done
