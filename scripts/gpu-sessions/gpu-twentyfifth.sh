#!/bin/bash
# On the GPU machine (twenty-fifth session): linear's products through cuBLASLt (bias and
# bias-gradient epilogues), device reshapes as views, 16-byte layout copies. The GPU
# conformance binary; the examples on cuda against the cpu (20 losses); then
# transformer-big-step and mlp-big-step side by side: this build with TORCHLEAN_CUBLASLT
# unset (= forward and VJP), =forward and =0, the parent build (gpu-bin/torchlean-base) and
# PyTorch (eager, and torch.compile for the transformer), alternating, two rounds; last the
# per-capsule kernel times of this build (TORCHLEAN_OP_TIMES: synchronized, for ranking).
# Second run (RUN=2): this build, the first run's (gpu-bin/torchlean-mid) and the parent's
# alternating; the composition (`auto`) beside flash attention. Logs are packed into one
# tarball (the device returns a few files only).
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs under $OUT.
source "$(dirname "$0")/../gpu-session-start.sh"
# every log in a scratch folder, packed into $OUT/logs.tgz at the end
dest=$log; log=/tmp/run25; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED|cublaslt_linear|layout_copies" $log/tests.txt | cut -c1-300 | head -20
source "$(dirname "$0")/../gpu-examples.sh"
examples_against_cpu quickstart-mlp mlp transformer
big=transformer-big-step
variants="lt forward classic base"; [ "${RUN:-1}" = 2 ] && variants="lt mid base auto"
for r in 1 2; do
  for v in $variants; do
    b=torchlean; env=""; prov="--provider prefer:native_cuda"
    case $v in forward) env="TORCHLEAN_CUBLASLT=forward";; classic) env="TORCHLEAN_CUBLASLT=0";; base) b=torchlean-base;; mid) b=torchlean-mid;; auto) prov="";; esac
    env $env gpu-bin/$b bench $big --device cuda $prov --reps 10 --json > $log/big.$v.$r.json 2> $log/big.$v.err
    env $env gpu-bin/$b bench mlp-big-step --device cuda --reps 20 --json > $log/mlp.$v.$r.json 2> $log/mlp.$v.err
    echo "round $r $v: transformer-big-step $(field $log/big.$v.$r.json median) ms, mlp-big-step $(field $log/mlp.$v.$r.json median) ms"
  done
  gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --backend compiled --reps 10 --json > $log/big.compiled.$r.json 2> $log/big.compiled.err
  gpu-bin/torchlean-base bench $big --device cuda --provider prefer:native_cuda --backend compiled --reps 10 --json > $log/big.compiled-base.$r.json 2> $log/big.compiled-base.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.$r.json 2>> $log/pt.err
  python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.$r.json 2>> $log/pt.err
  python3 bench/pytorch/bench.py mlp-big-step --device cuda --reps 20 > $log/mlp.pt.$r.json 2>> $log/pt.err
  echo "round $r compiled: this $(field $log/big.compiled.$r.json median), base $(field $log/big.compiled-base.$r.json median); PyTorch eager $(field $log/big.pt.$r.json median), torch.compile $(field $log/big.ptc.$r.json median), mlp-big-step $(field $log/mlp.pt.$r.json median) ms"
done
TORCHLEAN_OP_TIMES=1 gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 5 > $log/optimes.txt 2>&1
head -24 $log/optimes.txt | cut -c1-150
grep -m1 "^target" $log/optimes.txt | cut -c1-400
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
