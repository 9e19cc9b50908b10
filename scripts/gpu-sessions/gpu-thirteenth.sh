#!/bin/bash
# On the GPU machine (thirteenth session): the optimizers, the tape's gradient sums and
# clipping's scaling now run through `runtime::apply_update` on every device (on CUDA: the
# forward kernel, then the target takes the value — what `update_by_ops` did before). This
# runs the whole GPU conformance binary (training on the GPU against the CPU, RMSprop and
# Adagrad against the CPU, one host read per step, device graphs), the examples' first losses
# on cuda beside the CPU's, and mlp-big-step / transformer-big-step against PyTorch eager.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT (default /tmp/out).
set -u
cd "$(dirname "$0")/../.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REQUIRE_CUDA=1
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt
timeout 420 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|panicked|tests rc" $log/tests.txt | cut -c1-250
for ex in "quickstart-mlp --steps 100" "mlp --steps 60" "transformer --steps 20"; do
  name=$(echo $ex | cut -d' ' -f1)
  for d in cpu cuda; do
    timeout 180 gpu-bin/torchlean $ex --device $d > $log/$name.$d.txt 2>&1
    echo "$name $d rc=$?"
  done
  paste -d' ' <(grep -i loss $log/$name.cpu.txt | head -20) <(grep -i loss $log/$name.cuda.txt | head -20) | head -4
done
timeout 120 gpu-bin/torchlean transformer --steps 3 --device cuda --show-backend > $log/transformer.report.txt 2>&1
grep -E "^(ema_update|adam_update|add|scale):" $log/transformer.report.txt
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])' "$1" "$2"; }
for w in mlp-big-step transformer-big-step; do
  for r in 1 2; do
    gpu-bin/torchlean bench $w --device cuda --reps 10 --json > $log/$w.tl.$r.json 2> $log/$w.tl.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2>> $log/$w.pt.err
    echo "$w round $r: torchlean $(field $log/$w.tl.$r.json median) ms, PyTorch eager $(field $log/$w.pt.$r.json median) ms"
  done
done
