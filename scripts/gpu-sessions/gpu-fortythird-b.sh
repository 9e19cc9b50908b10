#!/bin/bash
# On the GPU machine (forty-third session, second call): the conformance binary only, for the
# session's later CUDA changes (cuFFT's Hermitian input, the empty-batch matmul VJP, the
# flash kernels' shared-memory check, the new spectral test). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 120
tar czf $log/logs.tgz -C $log tests.txt gpu.txt 2>/dev/null
