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
