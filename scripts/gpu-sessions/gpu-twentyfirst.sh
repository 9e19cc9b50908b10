#!/bin/bash
# On the GPU machine (twenty-first session): the vocabulary gained `conv2d_map` (a `torchlean`
# composition on CUDA: the CUDA conv2d, then each epilogue step as a CUDA op) and the shared
# conformance table gained its rows; no CUDA kernel changed. The whole GPU conformance binary
# (forward_matches_spec_on_the_gpu and vjp_matches_spec_on_the_gpu run the conv2d_map rows
# through the CUDA composition); the quickstart trained on the GPU by this build and by the
# parent's (gpu-bin/torchlean-base), loss lines compared.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
for mode in eager compiled; do
  for b in torchlean torchlean-base; do
    timeout 120 gpu-bin/$b quickstart-mlp --device cuda --backend $mode --steps 60 --show-backend > $log/qs.$mode.$b.txt 2>&1; echo "$b quickstart $mode rc=$?"
    grep -i "loss" $log/qs.$mode.$b.txt | sed -E 's/[0-9.]+ ?(ms|s|µs)//g' > $log/qs.$mode.$b.loss
  done
  cmp -s $log/qs.$mode.torchlean.loss $log/qs.$mode.torchlean-base.loss && echo "quickstart $mode loss lines: identical ($(wc -l < $log/qs.$mode.torchlean.loss) lines)" || { echo "quickstart $mode loss lines differ:"; diff $log/qs.$mode.torchlean.loss $log/qs.$mode.torchlean-base.loss | head -6; }
done
