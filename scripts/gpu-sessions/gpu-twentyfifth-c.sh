#!/bin/bash
# On the GPU machine (twenty-fifth session, fourth run): unbatched matmuls through cuBLASLt
# too. The GPU conformance binary; gemm-4096 and add-268435456 with cuBLASLt
# (TORCHLEAN_CUBLASLT unset) and with the classic API (=0) beside PyTorch, two rounds;
# transformer-big-step and mlp-big-step once beside PyTorch. Logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run25c; mkdir -p $log; cp $dest/gpu.txt $log/
TORCHLEAN_REQUIRE_CUDA=1 timeout 300 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "test result|panicked|tests rc|FAILED" $log/tests.txt | cut -c1-300 | head -10
for r in 1 2; do
  for w in gemm-4096 add-268435456; do
    gpu-bin/torchlean bench $w --device cuda --reps 50 --json > $log/$w.lt.$r.json 2> $log/$w.err
    TORCHLEAN_CUBLASLT=0 gpu-bin/torchlean bench $w --device cuda --reps 50 --json > $log/$w.classic.$r.json 2>> $log/$w.err
    python3 bench/pytorch/bench.py $w --device cuda --reps 50 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "round $r $w: cuBLASLt $(field $log/$w.lt.$r.json median), classic $(field $log/$w.classic.$r.json median), PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
for w in transformer-big-step mlp-big-step; do
  gpu-bin/torchlean bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.json 2> $log/$w.err
  python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.json 2>> $log/pt.err
  echo "$w: this $(field $log/$w.json median), PyTorch $(field $log/$w.pt.json median) ms"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
