#!/bin/bash
# On the GPU machine (fiftieth session, second run): the GPU conformance suite after amsgrad
# (Adam/AdamW with amsgrad on CUDA against the CPU in rmsprop_and_adagrad_on_the_gpu_match_the_cpu)
# and Adagrad's f64 rate. Logs in $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 150
grep -E "amsgrad|adagrad|rmsprop" $log/tests.txt | cut -c1-200 | head -8
