#!/bin/bash
# On the GPU machine (issue 11, ninth session): the device-graph GPU tests, then the
# transformer, mlp and cnn examples in compiled mode on cuda with and without CUDA Graph
# replay (TORCHLEAN_DEVICE_GRAPH=0), comparing their logged losses. Binaries from
# scripts/gpu-check.sh (gpu-bin/); logs under $OUT (default /tmp/out).
set -u
cd "$(dirname "$0")/.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REQUIRE_CUDA=1
log=${OUT:-/tmp/out}; mkdir -p $log
timeout 240 gpu-bin/gpu_only_conformance device_graph invalid_index quickstart_compiled non_finite rmsprop_and_adagrad --nocapture --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "^test |test result|panicked|left:|right:|refused as|tests rc" $log/tests.txt | cut -c1-300
grep "^executor" $log/tests.txt | grep -o "device graph: .\{0,80\}"
for ex in transformer mlp cnn; do
  for g in 1 0; do
    TORCHLEAN_DEVICE_GRAPH=$g timeout 200 gpu-bin/torchlean $ex --device cuda --backend compiled --steps 200 --show-backend > $log/$ex.graph$g.txt 2>&1; echo "$ex graph=$g rc=$?"
  done
  grep -h "executor at the end" $log/$ex.graph1.txt | grep -o "device graph: .\{0,140\}"
  grep -h "^summary" $log/$ex.graph*.txt | cut -c1-200
  diff <(grep -o "step [0-9]* loss [0-9.]*" $log/$ex.graph1.txt) <(grep -o "step [0-9]* loss [0-9.]*" $log/$ex.graph0.txt) > /dev/null && echo "$ex losses identical ($(grep -c -o "step [0-9]* loss [0-9.]*" $log/$ex.graph1.txt) logged)" || echo "$ex losses DIFFER"
done
