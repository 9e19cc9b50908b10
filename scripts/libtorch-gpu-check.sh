#!/usr/bin/env bash
# Builds, here, the LibTorch bundle for the GPU machine into libtorch-bin/ (ignored by git;
# carry it there), small (profile `gpu`: no debug info, stripped):
#   libtorch-bin/torchlean              the CLI with --features libtorch
#   libtorch-bin/libtorch_conformance   the LibTorch capsules' tests (crates/torchlean-libtorch)
#   libtorch-bin/run.sh                 run on the GPU machine: `bash libtorch-bin/run.sh`
#
# Needs a Python with PyTorch 2.11 (the GPU machine's version; tch 0.24 checks it):
#   python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch==2.11.0
#   TORCH_PYTHON=/work/venv-torch/bin/python scripts/libtorch-gpu-check.sh
# See docs/libtorch.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${TORCH_PYTHON:-/work/venv-torch/bin/python}
export LIBTORCH_USE_PYTORCH=1 PATH="$(dirname "$py"):$PATH"
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
"$py" -c 'import torch; v = torch.__version__; assert v.startswith("2.11."), v; print("building against torch", v)'
cargo build --profile gpu -p torchlean-cli --features libtorch --quiet
# the bridge's own workspace (outside the root one), sharing the root's target directory
test_bin=$(cd crates/torchlean-libtorch && CARGO_TARGET_DIR="$root/target" \
  cargo test --profile gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "libtorch_conformance":
        print(m["executable"])')
rm -rf libtorch-bin
mkdir -p libtorch-bin
cp target/gpu/torchlean libtorch-bin/torchlean
cp "$test_bin" libtorch-bin/libtorch_conformance
# the cited-test check reads these sources (the repo root moves on the GPU machine)
mkdir -p libtorch-bin/src
cp --parents crates/torchlean-libtorch/tests/libtorch_conformance.rs \
  crates/torchlean/tests/conformance.rs crates/torchlean-cuda/tests/gpu_only_conformance.rs \
  libtorch-bin/src/
cp scripts/libtorch-gpu-run.sh libtorch-bin/run.sh
git rev-parse HEAD > libtorch-bin/COMMIT
git status --porcelain | grep -q . && echo "dirty" >> libtorch-bin/COMMIT || true
"$py" -c 'import torch; print(torch.__version__)' > libtorch-bin/BUILT_AGAINST
ls -la libtorch-bin
du -sh libtorch-bin
size=$(du -sm libtorch-bin | cut -f1)
[ "$size" -lt 40 ] || { echo "libtorch-bin is ${size} MiB, over the 40 MiB limit" >&2; exit 1; }
echo "== ldd (everything but the torch and CUDA libraries must resolve here)"
torch_lib=$("$py" -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
for b in libtorch-bin/torchlean libtorch-bin/libtorch_conformance; do
  echo "$b:"; ldd "$b" | grep -E "not found|torch|c10" || true
  echo "$b with $torch_lib on the library path:"; LD_LIBRARY_PATH="$torch_lib" ldd "$b" | grep "not found" || echo "  all resolved"
done
