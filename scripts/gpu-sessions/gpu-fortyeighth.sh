#!/bin/bash
# On the GPU machine (forty-eighth session's fix): the GPU conformance binary again after
# `U_TAN` joined `unary_vjp`'s `reads_y` list (the H100 run at e64d7f3 failed exactly tan's
# four VJP rows: 1 + x² computed instead of 1 + y²). Build gpu-bin first with
# scripts/gpu-check.sh. Log in $OUT/tests.txt.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 300
grep -B2 -A6 "^tan \|vjp_matches_spec_on_the_gpu" $log/tests.txt | head -40
