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
[ ${#workloads[@]} -gt 0 ] || workloads=(gemm-256 gemm-1024 gemm-2048 mlp-step transformer-step sdpa tiny-ops tiny-ops-tape compiled-vs-eager quickstart-compiled-vs-eager)
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
printf '%-22s %14s %14s %8s  %s\n' workload torchlean pytorch ratio unit
field() { "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
# one alternating measurement: label, torchlean args, pytorch args (as strings)
measure() {
  local label=$1 tlargs=$2 ptargs=$3
  : > "$out/$label.tl"; : > "$out/$label.pt"
  for r in $(seq "$rounds"); do
    # shellcheck disable=SC2086
    if ! $tl bench $tlargs --device "$device" --reps "$reps" --json > "$out/$label.tl.$r.json" 2> "$out/$label.tl.err"; then
      printf '%-22s %14s %14s %8s  %s\n' "$label" "n/a" "-" "-" "$(head -c 120 "$out/$label.tl.err")"
      return
    fi
    # shellcheck disable=SC2086
    "$python" bench/pytorch/bench.py $ptargs --device "$device" --reps "$reps" > "$out/$label.pt.$r.json"
    field "$out/$label.tl.$r.json" median >> "$out/$label.tl"
    field "$out/$label.pt.$r.json" median >> "$out/$label.pt"
  done
  t=$(median < "$out/$label.tl"); p=$(median < "$out/$label.pt")
  printf '%-22s %14.4f %14.4f %8.3f  %s\n' "$label" "$t" "$p" "$(echo "$t / $p" | bc -l)" "$(field "$out/$label.tl.1.json" unit)"
}
for w in "${workloads[@]}"; do
  if [ "$w" = compiled-vs-eager ]; then
    measure mlp-step-b16-eager "mlp-step --batch-size 16 --backend eager" "mlp-step --batch-size 16"
    measure mlp-step-b16-compiled "mlp-step --batch-size 16 --backend compiled" "mlp-step --batch-size 16"
    e=$(median < "$out/mlp-step-b16-eager.tl"); c=$(median < "$out/mlp-step-b16-compiled.tl")
    printf '%-22s %14s %14s %8.3f  %s\n' "compiled/eager (b16)" "" "" "$(echo "$c / $e" | bc -l)" "torchlean compiled time / eager time"
  elif [ "$w" = quickstart-compiled-vs-eager ]; then
    # issue 4: the quickstart MLP (4-64-64-1, tanh, Adam, MSE) at batch 16; eager and
    # compiled alternate within each round, so drift of the machine affects both alike
    : > "$out/quickstart-eager.tl"; : > "$out/quickstart-compiled.tl"; : > "$out/quickstart.pt"
    for r in $(seq "$rounds"); do
      for mode in eager compiled; do
        $tl bench quickstart-step --backend $mode --device "$device" --reps "$reps" --json > "$out/quickstart-$mode.tl.$r.json"
        field "$out/quickstart-$mode.tl.$r.json" median >> "$out/quickstart-$mode.tl"
      done
      "$python" bench/pytorch/bench.py quickstart-step --device "$device" --reps "$reps" > "$out/quickstart.pt.$r.json"
      field "$out/quickstart.pt.$r.json" median >> "$out/quickstart.pt"
    done
    e=$(median < "$out/quickstart-eager.tl"); c=$(median < "$out/quickstart-compiled.tl"); p=$(median < "$out/quickstart.pt")
    printf '%-22s %14.4f %14.4f %8.3f  %s\n' "quickstart eager" "$e" "$p" "$(echo "$e / $p" | bc -l)" ms
    printf '%-22s %14.4f %14.4f %8.3f  %s\n' "quickstart compiled" "$c" "$p" "$(echo "$c / $p" | bc -l)" ms
    printf '%-22s %14s %14s %8.3f  %s\n' "quickstart eager/comp." "" "" "$(echo "$e / $c" | bc -l)" "compiled speed-up (eager time / compiled time)"
  else
    measure "$w" "$w" "$w"
  fi
done
echo "raw results and backend reports: $out"
