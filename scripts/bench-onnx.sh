#!/usr/bin/env bash
# Inference of the imported ONNX benchmark models (bench/onnx, batch 32, exported by PyTorch
# with scripts/make-onnx-fixtures.py bench/onnx --batch 32) in torchlean (compiled mode,
# checked_cpu), onnxruntime (CPU, 2 threads) and tract, alternately, in one run on this
# machine; prints the medians of the round medians and the ratio torchlean / onnxruntime.
#
#   scripts/bench-onnx.sh [--python PATH] [--rounds N] [--reps N] [MODEL ...]
#
# --python must have onnxruntime and numpy (pip install onnxruntime numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3; rounds=3; reps=50; models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || models=(cnn encoder mlp gru)
cargo build --release -p torchlean-cli --quiet
cargo build --release -p torchlean-onnx --example tract_bench --quiet
tl=target/release/torchlean; tract=target/release/examples/tract_bench
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { "$python" -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
printf '%-10s %12s %12s %12s %18s\n' model torchlean onnxruntime tract "torchlean/ort"
for m in "${models[@]}"; do
  f=bench/onnx/$m.onnx
  t=(); o=(); r=()
  for _ in $(seq "$rounds"); do
    t+=("$($tl bench "onnx:$f" --reps "$reps" --json | field median)")
    o+=("$("$python" bench/onnx/ort_bench.py "$f" --reps "$reps" | field median)")
    r+=("$($tract "$f" "$reps" | field median)")
  done
  tm=$(printf '%s\n' "${t[@]}" | median); om=$(printf '%s\n' "${o[@]}" | median); rm=$(printf '%s\n' "${r[@]}" | median)
  printf '%-10s %10.3f ms %10.3f ms %10.3f ms %18.2f\n' "$m" "$tm" "$om" "$rm" "$(echo "$tm / $om" | bc -l)"
done
