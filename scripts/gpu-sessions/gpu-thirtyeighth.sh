#!/bin/bash
# On the GPU machine (thirty-eighth session, final code): the thirty-seventh session's final
# run (scripts/gpu-sessions/gpu-thirtyseventh-c.sh) on this session's binaries — the GPU test
# binary now with `selected_zeros_stay_zero_under_infinite_cotangents_on_the_gpu` (the CUDA
# VJPs' selected zeros under infinite cotangents, against checked_cpu), then the examples
# against the CPU, then the figures of issues 11 and 12 beside PyTorch while time is left.
# DEADLINE seconds (default 560; 150 runs the tests only). Logs in $OUT/logs.tgz.
exec bash "$(dirname "$0")/gpu-thirtyseventh-c.sh" "$@"
