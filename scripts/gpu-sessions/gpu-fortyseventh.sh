#!/bin/bash
# On the GPU machine (forty-seventh session): the GPU conformance binary again, after
# d4e2405 made `round`'s exact rows compare NaN by class (the forty-sixth session's H100 run
# failed exactly the four `round [70000] (special values)` rows, "not bit-identical", with
# the NaN-payload explanation unverified), and with this session's `erf`, `tan`, `atan`, `asin` and
# `acos` rows (U_ERF … U_ACOS: the unary table, a fused chain). Log in $OUT/tests.txt.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 300
grep -B2 -A12 "round \[70000\]" $log/tests.txt | head -40
