#!/bin/bash
# On the GPU machine (fifty-fourth session): PyTorch as every op's oracle under checked_cuda
# and strict_native_cuda, with the long-sum cases added this session (a middle axis, every
# axis, a 4M-element row, a wide softmax, batch statistics of values near 100: the class of
# error found in the CPU's lane sums), at the recorded seed and another. Logs in $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
for s in 0 1; do
  timeout ${1:-200} python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean --seed $s \
    --profiles checked_cuda,strict_native_cuda --jobs 8 > $log/ops-seed$s.txt 2>&1
  echo "seed $s rc=$?"; grep -E "disagreement|runs," $log/ops-seed$s.txt | cut -c1-300 | tail -12
done
