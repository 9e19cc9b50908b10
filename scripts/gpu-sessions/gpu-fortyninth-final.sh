#!/bin/bash
# On the GPU machine (forty-ninth session, the session's last commit): the GPU conformance
# suite, then the audit models (gpu-bin/models.tgz, this build's checked_cpu results as the
# baseline; the GRU last-valid-step models, which import since this session, included) under
# checked_cuda. Logs in $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 150
mkdir -p /tmp/gz && tar xzf gpu-bin/models.tgz -C /tmp/gz
timeout ${1:-170} python3 scripts/model-cases-replay.py /tmp/gz/c --torchlean gpu-bin/torchlean \
  --profile checked_cuda --jobs 8 > $log/models-checked_cuda.txt 2>&1
echo "checked_cuda rc=$?"; grep -v "^refused" $log/models-checked_cuda.txt | cut -c1-400 | tail -6
