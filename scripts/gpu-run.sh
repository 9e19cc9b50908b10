#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there): the binaries scripts/gpu-check.sh built
# into gpu-bin/. Logs go to LOG_DIR (default gpu-logs/); with $OUT set (the device tool), the
# summaries and a tarball of everything are copied there (it returns at most 8 files).
#  1. the GPU conformance and behaviour tests, with TORCHLEAN_REQUIRE_CUDA=1 (a missing GPU
#     fails them instead of skipping);
#  2. the CLI on the GPU (the report's target line) and the CPU-only refusal simulated by
#     hiding the libraries;
#  3. torchlean and PyTorch side by side, alternating, 3 rounds (bench/pytorch/bench.py).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${1:-gpu-logs}
mkdir -p "$log"
export TORCHLEAN_REQUIRE_CUDA=1 TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache
tl=gpu-bin/torchlean
{ date -u; cat gpu-bin/COMMIT; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv; } > "$log/machine.txt" 2>&1
echo "== tests"
gpu-bin/gpu_only_conformance --test-threads=1 --nocapture > "$log/tests.log" 2>&1
echo "tests exit $?"; grep -E "^test |test result|rows passed|panicked" "$log/tests.log"
echo "== cli: the report's target line, and the examples on cuda against the cpu (both modes)"
$tl bench gemm-256 --device cuda --reps 3 > "$log/cli.txt" 2>&1; echo "cli exit $?"
grep -E "^target" "$log/cli.txt"
for cmd in quickstart-mlp mlp; do
  for mode in eager compiled; do
    $tl $cmd --steps 100 --backend $mode > "$log/$cmd-$mode-cpu.txt" 2>&1
    $tl $cmd --steps 100 --backend $mode --device cuda > "$log/$cmd-$mode-cuda.txt" 2>&1; rc=$?
    if diff <(grep "^step" "$log/$cmd-$mode-cpu.txt") <(grep "^step" "$log/$cmd-$mode-cuda.txt") > /dev/null; then same="the cpu's printed losses"; else same="LOSSES DIFFER from the cpu's"; fi
    echo "$cmd --backend $mode --device cuda: exit $rc, $(grep -c '^step' "$log/$cmd-$mode-cuda.txt") logged steps, $same" | tee -a "$log/cli.txt"
  done
done
echo "== bench (torchlean vs PyTorch 2.x, same machine, alternating)"
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]] if sys.argv[2] in d else d["details"][sys.argv[2]])' "$1" "$2"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-16s %12s %12s %8s  %s\n' workload torchlean pytorch ratio unit | tee "$log/bench.txt"
for w in gemm-4096 add-268435456 tiny-ops tiny-ops-tape mlp-big-step mlp-step quickstart-step transformer-step transformer-big-step; do
  : > "$log/$w.tl"; : > "$log/$w.pt"
  for r in 1 2 3; do
    if ! $tl bench "$w" --device cuda --reps 20 --json > "$log/$w.tl.$r.json" 2> "$log/$w.tl.err"; then
      echo "$w: torchlean failed: $(head -c 300 "$log/$w.tl.err")" | tee -a "$log/bench.txt"; continue 2
    fi
    python3 bench/pytorch/bench.py "$w" --device cuda --reps 20 > "$log/$w.pt.$r.json" 2>> "$log/$w.pt.err"
    field "$log/$w.tl.$r.json" median >> "$log/$w.tl"; field "$log/$w.pt.$r.json" median >> "$log/$w.pt"
  done
  t=$(median < "$log/$w.tl"); p=$(median < "$log/$w.pt")
  printf '%-16s %12.4f %12.4f %8.3f  %s\n' "$w" "$t" "$p" "$(python3 -c "print($t/$p)")" "$(field "$log/$w.tl.1.json" unit)" | tee -a "$log/bench.txt"
done
for w in gemm-4096 add-268435456; do
  k=$([ "$w" = gemm-4096 ] && echo gflops || echo gb_per_s)
  echo "$w $k: torchlean $(field "$log/$w.tl.1.json" $k) pytorch $(field "$log/$w.pt.1.json" $k)" | tee -a "$log/bench.txt"
done
if [ -n "${OUT:-}" ]; then
  cp "$log/machine.txt" "$log/tests.log" "$log/cli.txt" "$log/bench.txt" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu-logs.tgz" "$log"
fi
