#!/bin/bash
# On the GPU machine (fifty-fourth session). On an H200 (never lent for the figures so far):
# the GPU test binary, then issue 12's and issue 11's figures beside PyTorch while time is
# left. On any card: PyTorch as every op's oracle under checked_cuda (and strict_native_cuda
# where time is left), with the long-sum cases added this session (a middle axis, every
# axis, a 4M-element row, a wide softmax, batch statistics of values near 100: the class of
# error found in the CPU's lane sums). DEADLINE seconds (default 560). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run54; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-560}; left() { echo $(( D - ($(date +%s) - start) )); }
oracle() {  # oracle SEED PROFILES LIMIT
  timeout $3 python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean --seed $1 \
    --profiles $2 --jobs 8 > $log/ops-seed$1.txt 2>&1
  echo "oracle seed $1 ($2) rc=$?"; grep -E "disagreement|runs," $log/ops-seed$1.txt | cut -c1-300 | tail -12
}
if grep -q H200 $log/gpu.txt; then
  gpu_tests 170
  p="--device cuda --json"
  for w in attn-fwd-none attn-fwd-mask attn-fwd-causal attn-step-none attn-step-mask attn-step-causal; do
    [ $(left) -gt 330 ] && pair $w 20 $w "" ""
  done
  [ $(left) -gt 300 ] && pair transformer-big-step 10 big.eager "" ""
  [ $(left) -gt 270 ] && pair transformer-big-step 10 big.compiled "--backend compiled" "--compile"
  [ $(left) -gt 250 ] && pair gemm-4096 20 gemm "" ""
  [ $(left) -gt 242 ] && pair add-268435456 20 add "" ""
  [ $(left) -gt 235 ] && pair mlp-big-step 50 mlpbig "" ""
  [ $(left) -gt 220 ] && pair tiny-ops 20 tiny "" ""
  [ $(left) -gt 205 ] && pair quickstart-step 50 qs.compiled "--backend compiled" ""
  [ $(left) -gt 190 ] && attn_memory 2048 8192 32768
  [ $(left) -gt 60 ] && oracle 0 checked_cuda $(( $(left) - 20 ))
else
  oracle 0 checked_cuda,strict_native_cuda $(( $(left) / 2 ))
  [ $(left) -gt 60 ] && oracle 1 checked_cuda $(( $(left) - 20 ))
fi
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
