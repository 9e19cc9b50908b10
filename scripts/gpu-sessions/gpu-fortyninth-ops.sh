#!/bin/bash
# On the GPU machine (forty-ninth session): PyTorch as the oracle of every op on the GPU
# (`scripts/pytorch-oracle.py`, last run there in the twenty-third session; the ops and CUDA
# kernels added since — the hyperbolic and inverse trigonometric maps, erf, tan, round's
# special values, … — included), under checked_cuda and strict_native_cuda, then with the
# native_cuda provider preferred. Logs in $OUT/ops-*.txt.
source "$(dirname "$0")/../gpu-session-start.sh"
timeout ${1:-300} python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean \
  --profiles checked_cuda,strict_native_cuda --jobs 8 > $log/ops-profiles.txt 2>&1
echo "profiles rc=$?"; tail -12 $log/ops-profiles.txt
timeout ${2:-200} python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean \
  --profiles checked_cuda --extra "--provider prefer:native_cuda" --jobs 8 > $log/ops-native.txt 2>&1
echo "native rc=$?"; tail -12 $log/ops-native.txt
