#!/bin/bash
# On the GPU machine (fifteenth session): where transformer-big-step's time goes, ours and
# PyTorch's. Our per-capsule table (TORCHLEAN_OP_TIMES=1, synchronized per call: for ranking
# only), the step times of gpu-bin/torchlean against gpu-bin/torchlean-base (the previous
# commit, when present) alternating, eager and compiled, PyTorch's, and PyTorch's CUDA
# kernels grouped by name (bench/pytorch/profile_step.py). Then the GPU conformance binary.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
set -u
cd "$(dirname "$0")/.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt
which nsys ncu nvcc >> $log/gpu.txt 2>&1
cat $log/gpu.txt
w=transformer-big-step
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d[sys.argv[2]],3))' "$1" "$2"; }
TORCHLEAN_OP_TIMES=1 gpu-bin/torchlean bench $w --device cuda --reps 5 > $log/optimes.txt 2>&1
head -50 $log/optimes.txt | cut -c1-160
python3 bench/pytorch/profile_step.py --steps 5 --top 40 > $log/pt-profile.txt 2>&1; cat $log/pt-profile.txt | cut -c1-200
for r in 1 2; do
  for b in torchlean-base torchlean; do
    [ -x gpu-bin/$b ] || continue
    for m in eager compiled; do
      gpu-bin/$b bench $w --device cuda --reps 10 --backend $m --json > $log/$b.$m.$r.json 2> $log/$b.err
      echo "round $r $b $m: $(field $log/$b.$m.$r.json median) ms (min $(field $log/$b.$m.$r.json min))"
    done
  done
  python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/pt.$r.json 2>> $log/pt.err
  echo "round $r PyTorch eager: $(field $log/pt.$r.json median) ms"
done
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-250
