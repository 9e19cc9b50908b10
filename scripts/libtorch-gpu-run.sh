#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there), as libtorch-bin/run.sh (built by
# scripts/libtorch-gpu-check.sh): `bash libtorch-bin/run.sh`. Needs `python3` with torch 2.11
# (its lib/ directory goes on the library path: libtorch, c10, and through their RUNPATH the
# CUDA libraries of the pip wheels). Logs go to $OUT (the device tool), else libtorch-logs/.
#  1. the LibTorch capsules against the f64 spec on the CPU and on CUDA, with
#     TORCHLEAN_REQUIRE_CUDA=1 (a missing GPU fails them instead of skipping);
#  2. the transformer example trained end to end under libtorch_forward_cuda and
#     libtorch_autograd_cuda (and checked_cuda beside them), each with its backend report
#     (text and JSON): the attention rows show the trusted-external LibTorch boundary;
#  3. the same two libtorch profiles in compiled mode.
set -uo pipefail
bin=$(cd "$(dirname "$0")" && pwd)
log=${OUT:-$bin/../libtorch-logs}
mkdir -p "$log"
torch_lib=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TORCHLEAN_REQUIRE_CUDA=1 TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache TORCHLEAN_REPO_ROOT="$bin/src"
{
  date -u; echo "commit $(cat "$bin/COMMIT")"; echo "built against torch $(cat "$bin/BUILT_AGAINST")"
  python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "ldd torchlean (not found / torch):"; ldd "$bin/torchlean" | grep -E "not found|torch|c10"
} > "$log/machine.txt" 2>&1
cat "$log/machine.txt"
echo "== tests (CPU and CUDA, TORCHLEAN_REQUIRE_CUDA=1)"
"$bin/libtorch_conformance" --test-threads=1 --nocapture > "$log/tests.log" 2>&1
echo "tests exit $?"; grep -E "^test |test result|panicked|skipped" "$log/tests.log"
echo "== transformer, end to end (400 steps, the default)"
for p in libtorch_forward_cuda libtorch_autograd_cuda checked_cuda; do
  "$bin/torchlean" transformer --profile "$p" --show-backend --report-json "$log/transformer-$p.report.json" \
    > "$log/transformer-$p.txt" 2>&1
  rc=$?
  echo "$p: exit $rc"
  grep -E "^(profile|target)|scaled_dot_product_attention|^summary" "$log/transformer-$p.txt" | head -12
  grep -E "value:.*trusted_boundary|vjp:.*trusted_boundary" "$log/transformer-$p.txt" | head -4
done
echo "== transformer, compiled mode, both libtorch profiles"
for p in libtorch_forward_cuda libtorch_autograd_cuda; do
  "$bin/torchlean" transformer --profile "$p" --backend compiled --show-backend \
    --report-json "$log/transformer-$p-compiled.report.json" > "$log/transformer-$p-compiled.txt" 2>&1
  echo "$p --backend compiled: exit $?"
  grep -E "^scaled_dot_product_attention|^summary" "$log/transformer-$p-compiled.txt" | head -3
done
echo "logs in $log"
