#!/bin/bash
# On the GPU machine (twenty-seventh session, first run): where transformer-big-step's device
# time goes. Ours per capsule with CUDA events (TORCHLEAN_OP_TIMES=device: unsynchronized, the
# kernels' own time in a step bound by them), PyTorch's kernels grouped by name for its eager
# step and for torch.compile (bench/pytorch/profile_step.py), and the wall times side by side
# (one round). mlp-big-step's per-capsule device time too.
# Binaries from scripts/gpu-check.sh (gpu-bin/); logs packed into $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run27; mkdir -p $log; cp $dest/gpu.txt $log/
big=transformer-big-step
TORCHLEAN_OP_TIMES=device gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 5 > $log/devtimes.txt 2>&1
head -40 $log/devtimes.txt | cut -c1-150
TORCHLEAN_OP_TIMES=device gpu-bin/torchlean bench mlp-big-step --device cuda --reps 10 > $log/devtimes-mlp.txt 2>&1
head -16 $log/devtimes-mlp.txt | cut -c1-150
python3 bench/pytorch/profile_step.py --steps 5 --top 45 > $log/pt-profile.txt 2>&1; cut -c1-180 $log/pt-profile.txt | head -46
python3 bench/pytorch/profile_step.py --steps 5 --top 45 --compile > $log/ptc-profile.txt 2>&1; cut -c1-180 $log/ptc-profile.txt | grep -v Warning | head -46
gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --reps 10 --json > $log/big.this.json 2> $log/big.this.err
gpu-bin/torchlean bench $big --device cuda --provider prefer:native_cuda --backend compiled --reps 10 --json > $log/big.compiled.json 2> $log/big.compiled.err
python3 bench/pytorch/bench.py $big --device cuda --reps 10 > $log/big.pt.json 2>> $log/pt.err
python3 bench/pytorch/bench.py $big --device cuda --reps 10 --compile > $log/big.ptc.json 2>> $log/pt.err
echo "eager $(field $log/big.this.json median), compiled $(field $log/big.compiled.json median); PyTorch eager $(field $log/big.pt.json median), torch.compile $(field $log/big.ptc.json median) ms"
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
