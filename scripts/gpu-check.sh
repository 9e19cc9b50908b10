#!/usr/bin/env bash
# Builds, here, the binaries the GPU run needs, small (profile `gpu`: no debug info,
# stripped), into gpu-bin/ (ignored by git; carry it to the GPU machine), then — on the GPU
# machine — scripts/gpu-run.sh runs them and writes logs.
#
#   scripts/gpu-check.sh            # build into gpu-bin/
#   scripts/gpu-run.sh [LOG_DIR]    # on the GPU machine: tests with TORCHLEAN_REQUIRE_CUDA=1,
#                                   # then torchlean vs PyTorch side by side
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile gpu -p torchlean-cli --quiet
test_bin=$(cargo test --profile gpu -p torchlean-cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_only_conformance":
        print(m["executable"])')
mkdir -p gpu-bin
cp target/gpu/torchlean gpu-bin/torchlean
cp "$test_bin" gpu-bin/gpu_only_conformance
git rev-parse HEAD > gpu-bin/COMMIT
git status --porcelain | grep -q . && echo "dirty" >> gpu-bin/COMMIT || true
ls -la gpu-bin
