#!/bin/bash
# On the GPU machine (thirty-seventh session): the GPU test binary and every example against
# the CPU's losses on the code after the thirty-sixth session's changes (compiled reports of
# what ran, parts sessions forked per run, checkpoint v2), then an experiment for issue 12:
# does the flash VJP's key kernel lose time to a partial last wave? Its grid is 64-key tiles
# × B·H blocks (4096 at B=8 H=16 L=2048: 15.5 waves at 2 blocks per SM on 132 SMs); at
# L = 1984, 2048, 2112 (31, 32, 33 tiles: 15.0, 15.5, 16.0 waves) a wave-bound kernel's time
# grows like 496 : 512 : 528, a work-bound one like L² (0.939 : 1 : 1.064). Also the
# tensor-core VJP (TORCHLEAN_FLASH_MMA=1) at L = 2048, never measured against the restaged
# f32 kernel. DEADLINE seconds in all (default 540). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run37; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-540}; left() { echo $(( D - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,multiprocessor_count --format=csv,noheader 2>/dev/null | head -1
TORCHLEAN_REQUIRE_CUDA=1 timeout 200 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-300 | head -12
p="--device cuda --provider prefer:native_cuda --json"
for r in 1 2; do
  for l in 1984 2048 2112; do
    [ $(left) -gt 300 ] && pair attn-step-none-L$l 20 step.L$l.$r "" ""
  done
  [ $(left) -gt 300 ] && TORCHLEAN_FLASH_MMA=1 pair attn-step-none 20 mmavjp.$r "" ""
done
source scripts/gpu-examples.sh
[ $(left) -gt 150 ] && examples_against_cpu quickstart-mlp mlp transformer cnn 2>&1 | tee $log/examples.txt
[ $(left) -gt 90 ] && examples_against_cpu rnn autoencoder fno1d 2>&1 | tee -a $log/examples.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
