#!/usr/bin/env bash
# Runs each workload in torchlean and in PyTorch (bench/pytorch/bench.py), alternately, in one
# run on this machine, and prints: workload, torchlean median, PyTorch median, ratio.
#
#   scripts/bench-vs-pytorch.sh [--device cpu|cuda] [--python PATH] [--rounds N] [--reps N] [WORKLOAD ...]
#
# Without --python, a virtual environment with PyTorch is created in .bench-venv (from the
# package index). The JSON of every run (with torchlean's backend report) goes to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
device=cpu; python=""; rounds=3; reps=20; workloads=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) workloads+=("$1"); shift ;;
  esac
done
[ ${#workloads[@]} -gt 0 ] || workloads=(gemm-256 gemm-1024 gemm-2048 mlp-step tiny-ops tiny-ops-tape)
if [ -z "$python" ]; then
  if [ ! -x .bench-venv/bin/python ]; then
    python3 -m venv .bench-venv
    .bench-venv/bin/pip install --quiet torch numpy
  fi
  python=.bench-venv/bin/python
fi
cargo build --release -p torchlean-cli --quiet
tl=target/release/torchlean
out=bench/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-16s %14s %14s %8s  %s\n' workload torchlean pytorch ratio unit
for w in "${workloads[@]}"; do
  : > "$out/$w.tl"; : > "$out/$w.pt"
  for r in $(seq "$rounds"); do
    $tl bench "$w" --device "$device" --reps "$reps" --json > "$out/$w.tl.$r.json"
    "$python" bench/pytorch/bench.py "$w" --device "$device" --reps "$reps" > "$out/$w.pt.$r.json"
    "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"])' "$out/$w.tl.$r.json" >> "$out/$w.tl"
    "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"])' "$out/$w.pt.$r.json" >> "$out/$w.pt"
  done
  t=$(median < "$out/$w.tl"); p=$(median < "$out/$w.pt")
  unit=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["unit"])' "$out/$w.tl.1.json")
  printf '%-16s %14.4f %14.4f %8.3f  %s\n' "$w" "$t" "$p" "$(echo "$t / $p" | bc -l)" "$unit"
done
echo "raw results and backend reports: $out"
