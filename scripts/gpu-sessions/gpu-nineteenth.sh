#!/bin/bash
# On the GPU machine (nineteenth session): the CLI now runs its command on a compute-pool
# thread (torchlean::runtime::on_compute_threads), so CUDA contexts, streams and CUDA Graph
# capture are used from that thread. The GPU conformance binary (filter $TESTS); the
# quickstart trained on the GPU by this build and by the parent's (gpu-bin/torchlean-base),
# loss lines compared; then tiny-ops, quickstart-step (compiled, graph replay) and
# transformer-big-step, this build vs the parent's vs PyTorch, alternating ($ROUNDS rounds).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance ${TESTS:-} --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -20
base=gpu-bin/torchlean-base
for mode in eager compiled; do
  for b in torchlean torchlean-base; do
    timeout 120 gpu-bin/$b quickstart-mlp --device cuda --backend $mode --steps 60 --show-backend > $log/qs.$mode.$b.txt 2>&1; echo "$b quickstart $mode rc=$?"
    grep -i "loss" $log/qs.$mode.$b.txt | sed -E 's/[0-9.]+ ?(ms|s|µs)//g' > $log/qs.$mode.$b.loss
  done
  cmp -s $log/qs.$mode.torchlean.loss $log/qs.$mode.torchlean-base.loss && echo "quickstart $mode loss lines: identical ($(wc -l < $log/qs.$mode.torchlean.loss) lines)" || { echo "quickstart $mode loss lines differ:"; diff $log/qs.$mode.torchlean.loss $log/qs.$mode.torchlean-base.loss | head -6; }
  tail -1 $log/qs.$mode.torchlean.loss
done
grep -iE "^target|device graph" $log/qs.compiled.torchlean.txt | head -3 | cut -c1-300
run() { # name, then the torchlean bench arguments
  local w=$1; shift
  for r in $(seq 1 ${ROUNDS:-2}); do
    gpu-bin/torchlean bench $w --device cuda "$@" --json > $log/$w.new.$r.json 2> $log/$w.new.err
    $base bench $w --device cuda "$@" --json > $log/$w.base.$r.json 2> $log/$w.base.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2> $log/$w.pt.err
    echo "round $r $w $*: this build $(field $log/$w.new.$r.json median) ms, parent $(field $log/$w.base.$r.json median) ms, PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
}
run tiny-ops --reps 10
run quickstart-step --backend compiled --reps 50
[ -z "${SKIP_BIG:-}" ] && run transformer-big-step --provider prefer:native_cuda --reps 10
tail -3 $log/tiny-ops.new.err $log/quickstart-step.new.err 2>/dev/null | cut -c1-300
