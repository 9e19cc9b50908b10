#!/bin/bash
# On the GPU machine (thirty-second session, third run): the flash VJP's two key/value kernels
# compared at the issue's size (B=8 H=16 L=2048 D=64) — the default f32 FMA kernel against the
# split-TF32 tensor-core one (TORCHLEAN_FLASH_MMA=1, opt-in since the seventeenth session, last
# measured before the f32 kernel was restaged in the twenty-sixth) — beside PyTorch's SDPA,
# forward + backward, unmasked, causal and with a boolean mask, two rounds. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run32b; mkdir -p $log; cp $dest/gpu.txt $log/
p="--device cuda --provider prefer:native_cuda --reps 10 --json"
for r in 1 2; do
  for w in attn-step-none attn-step-causal attn-step-mask; do
    timeout 60 gpu-bin/torchlean bench $w $p > $log/$w.f32.$r.json 2>> $log/err
    TORCHLEAN_FLASH_MMA=1 timeout 60 gpu-bin/torchlean bench $w $p > $log/$w.mma.$r.json 2>> $log/err
    timeout 60 python3 bench/pytorch/bench.py $w --device cuda --reps 10 > $log/$w.pt.$r.json 2>> $log/err
    echo "round $r $w: f32 VJP $(field $log/$w.f32.$r.json median) tensor-core VJP $(field $log/$w.mma.$r.json median) PyTorch $(field $log/$w.pt.$r.json median) ms"
  done
done
tail -3 $log/err
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
