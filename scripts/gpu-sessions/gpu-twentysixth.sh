#!/bin/bash
# On the GPU machine (twenty-sixth session): the key/value VJP in three barriers per query
# tile (flash_bwd_kv_one_chunk). ptxas's report for the key kernels, the GPU conformance
# binary (filter $TESTS), attn-step-{none,mask,causal} and attn-fwd-none (`--provider
# prefer:native_cuda`) three ways, alternating: this build, gpu-bin/torchlean-base (the
# session-start build) and PyTorch's SDPA; transformer-big-step likewise; then Nsight Compute
# on the new key kernel (one launch). Env TESTS, ROUNDS, WORKLOADS, SKIP_BIG, SKIP_NCU; logs
# under $OUT, packed into logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
# only logs.tgz under $OUT (the device returns a few files whole)
log=/tmp/gpu-logs; mkdir -p $log
mkdir -p $log/ptx
cat crates/torchlean-cuda/kernels/{elementwise,rows,conv,spectral,attention}.cu > $log/ptx/all.cu
nvcc -arch=sm_90 -cubin -std=c++17 -Xptxas -v -o $log/ptx/all.cubin $log/ptx/all.cu > $log/ptx/ptxas.txt 2>&1
grep -A3 -E "Compiling entry function 'flash_bwd_kv(_tiles)?'" $log/ptx/ptxas.txt | grep -E "flash_|registers|spill"
TORCHLEAN_REQUIRE_CUDA=1 timeout 400 gpu-bin/gpu_only_conformance ${TESTS:-} --test-threads 1 --nocapture > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|worst|FAILED" $log/tests.txt | cut -c1-300 | head -30
base=gpu-bin/torchlean-base
for r in $(seq 1 ${ROUNDS:-2}); do
  for w in ${WORKLOADS:-attn-step-none attn-step-mask attn-step-causal attn-fwd-none}; do
    gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.new.$r.json 2> $log/$w.new.err
    $base bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.base.$r.json 2> $log/$w.base.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "round $r $w: this build $(field $log/$w.new.$r.json median) ms, base $(field $log/$w.base.$r.json median) ms, PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
  if [ -z "${SKIP_BIG:-}" ]; then
    gpu-bin/torchlean bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.new.$r.json 2> $log/big.new.err
    $base bench transformer-big-step --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.base.$r.json 2> $log/big.base.err
    python3 bench/pytorch/bench.py transformer-big-step --device cuda --reps 10 > $log/big.pt.$r.json 2> $log/big.pt.err
    echo "round $r transformer-big-step: this build $(field $log/big.new.$r.json median) ms, base $(field $log/big.base.$r.json median) ms, PyTorch $(field $log/big.pt.$r.json median) ms"
  fi
done
if [ -z "${SKIP_NCU:-}" ]; then
  timeout 240 ncu --clock-control none -k regex:"flash_bwd_kv" -c 1 --set full --import-source no -o $log/kv \
    --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    gpu-bin/torchlean bench attn-step-none --device cuda --provider prefer:native_cuda --reps 1 > $log/ncu-run.txt 2>&1
  echo "ncu rc=$?"
  ncu -i $log/kv.ncu-rep --print-details all > $log/ncu.txt 2>&1
  ncu -i $log/kv.ncu-rep --page source --csv --print-source sass > $log/sass.csv 2>&1
  grep -E "^  flash|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Executed Instructions  |highest-utilized|bank conflicts" $log/ncu.txt | cut -c1-200 | head -20
  grep -E "issue_stalled" $log/ncu.txt | awk '{print $1, $NF}' | sort -k2 -n -r | head -12
fi
rm -f $log/kv.ncu-rep; tar czf $OUT/logs.tgz -C $log . 2>/dev/null || true
