# Sourced by the per-session GPU scripts (scripts/gpu-sessions/gpu-fifteenth.sh … gpu-seventeenth.sh) on the
# GPU machine: the repository root as working directory, the kernel cache, the log folder
# ($OUT, else /tmp/out) as $log with the GPU's name, driver and clock and the binaries'
# commit in gpu.txt, and `field FILE KEY` to read one number from a bench JSON file.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export TORCHLEAN_CACHE_DIR=/tmp/torchlean-cache
log=${OUT:-/tmp/out}; mkdir -p $log
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $log/gpu.txt 2>&1
cat gpu-bin/COMMIT >> $log/gpu.txt; cat $log/gpu.txt
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d[sys.argv[2]],3))' "$1" "$2" 2>/dev/null || echo "?"; }
# `pair NAME REPS TAG [torchlean flags] [PyTorch flags]`: one alternating round of a bench
# workload, torchlean (with the caller's `$p` flags) then PyTorch, JSON under $log/TAG.*.json,
# one summary line.
pair() {
  local w=$1 reps=$2 tag=$3 tl=$4 pt=$5
  timeout 90 gpu-bin/torchlean bench $w $p --reps $reps $tl > $log/$tag.tl.json 2>> $log/err
  timeout 150 python3 bench/pytorch/bench.py $w --device cuda --reps $reps $pt > $log/$tag.pt.json 2>> $log/err
  echo "$tag: torchlean $(field $log/$tag.tl.json median) PyTorch $(field $log/$tag.pt.json median)"
}
# `solo NAME REPS TAG [torchlean flags]`: torchlean alone (with the caller's `$p` flags and
# environment), JSON under $log/TAG.tl.json, one summary line.
solo() {
  local w=$1 reps=$2 tag=$3 tl=${4:-}
  timeout 90 gpu-bin/torchlean bench $w $p --reps $reps $tl > $log/$tag.tl.json 2>> $log/err \
    && echo "$tag: torchlean $(field $log/$tag.tl.json median)"
}
# `attn_memory L...`: flash attention's forward + backward at each length L (B=1, H=16,
# D=64, unmasked, with the caller's `$p` flags), one line each with the median and the
# device memory statistics (issue 12: memory linear in L). JSON under $log/mem.L.json.
attn_memory() {
  local l
  for l in "$@"; do
    timeout 60 gpu-bin/torchlean bench attn-step-none-L$l-B1 $p --reps 3 --warmup 1 --warmup-seconds 0 > $log/mem.$l.json 2>> $log/err
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d.get("memory") or d.get("details",{}).get("memory"); print("L", sys.argv[2], "median", round(d["median"],3), "memory", m)' $log/mem.$l.json $l 2>/dev/null || echo "L $l: no result"
  done
}
# `gpu_tests LIMIT`: the GPU test binary with TORCHLEAN_REQUIRE_CUDA=1 (a missing GPU fails
# it), at most LIMIT seconds, its log in $log/tests.txt, and the summary lines printed.
gpu_tests() {
  TORCHLEAN_REQUIRE_CUDA=1 timeout $1 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
  grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-300 | head -12
}
