#!/bin/bash
# On the GPU machine (twenty-sixth session, an experiment): the flash key kernel's inner
# products fully unrolled (gpu-bin/torchlean-U, source gpu-bin/attention-U.cu) and also without
# the Pᵀ/dSᵀ swizzle (torchlean-N, attention-N.cu) beside the committed build (torchlean):
# ptxas's report for each, then attn-step-{none,causal} and transformer-big-step alternating,
# two rounds, with PyTorch. Logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run26c; mkdir -p $log; cp $dest/gpu.txt $log/
for v in U N; do
  cat crates/torchlean-cuda/kernels/{elementwise,rows,conv,spectral}.cu gpu-bin/attention-$v.cu > $log/all-$v.cu
  nvcc -arch=sm_90 -cubin -std=c++17 -Xptxas -v -o $log/all-$v.cubin $log/all-$v.cu > $log/ptxas-$v.txt 2>&1
  echo "$v: $(grep -A3 -E "Compiling entry function 'flash_bwd_kv'" $log/ptxas-$v.txt | grep -E "registers|spill" | tr '\n' ' ')"
done
for r in 1 2; do
  for w in attn-step-none attn-step-causal transformer-big-step; do
    line="round $r $w:"
    for v in torchlean torchlean-U torchlean-N; do
      gpu-bin/$v bench $w --device cuda --provider prefer:native_cuda --reps 10 --json > $log/$w.$v.$r.json 2> $log/$w.$v.err
      line="$line $v $(field $log/$w.$v.$r.json median)"
    done
    python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2>> $log/pt.err
    echo "$line PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
rm -f $log/*.cubin; tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
