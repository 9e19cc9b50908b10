#!/bin/bash
# On the GPU machine (thirty-second session, second run): the whole GPU test binary on this
# build (the flash kernels' sources split into kernels/attention/*.cu: the same code, joined
# in one program), then every example against the CPU's losses in both modes,
# the transformer under flash / auto / strict_native_cuda, and PyTorch as an oracle for every
# op. DEADLINE seconds in all. Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run32; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-420}; left() { echo $(( D - ($(date +%s) - start) )); }
TORCHLEAN_REQUIRE_CUDA=1 timeout 120 gpu-bin/gpu_only_conformance --test-threads 1 > $log/tests.txt 2>&1; echo "tests rc=$?" >> $log/tests.txt
grep -E "FAIL|panicked|test result|tests rc" $log/tests.txt | cut -c1-160 | head -20
source scripts/gpu-examples.sh
[ $(left) -gt 150 ] && examples_against_cpu quickstart-mlp quickstart-cnn mlp cnn transformer autoencoder fno1d rnn 2>&1 | tee $log/examples.txt
[ $(left) -gt 120 ] && OUT=$log/attention timeout $(( $(left) - 100 )) bash scripts/gpu-attention.sh > /dev/null 2>&1; cat $log/attention/attention.txt 2>/dev/null
[ $(left) -gt 60 ] && timeout $(( $(left) - 20 )) python3 scripts/pytorch-oracle.py --torchlean gpu-bin/torchlean --jobs 12 --profiles checked_cuda,strict_native_cuda > $log/oracle.txt 2>&1; echo "oracle rc=$?"; tail -5 $log/oracle.txt
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
