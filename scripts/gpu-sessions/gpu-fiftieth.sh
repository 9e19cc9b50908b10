#!/bin/bash
# On the GPU machine (fiftieth session): Adam's constants as payloads (`ema_update`'s weight,
# `adam_step`'s weight1/weight2). The GPU conformance suite (adam_step's CUDA bits against the
# CPU's, in place and not), then the GRU and MLP examples with Adam and AdamW on the CPU and
# on CUDA, eager and compiled, per-step losses compared (the CUDA kernels' ema and adam
# arithmetic is the CPU's, step by step: the losses should agree to the products' rounding).
source "$(dirname "$0")/../gpu-session-start.sh"
gpu_tests 150
for opt in adam adamw; do
  for be in eager compiled; do
    for dev in cpu cuda; do
      timeout 60 gpu-bin/torchlean rnn --optimizer $opt --lr 0.01 --steps 100 --batch-size 400 \
        --backend $be --device $dev --log $log/rnn.$opt.$be.$dev.jsonl --log-every 1 > $log/rnn.$opt.$be.$dev.txt 2>&1
      echo "rnn $opt $be $dev rc=$?"
    done
    python3 - $log/rnn.$opt.$be.cpu.jsonl $log/rnn.$opt.$be.cuda.jsonl <<'PY'
import json,sys
a=[json.loads(l)['loss'] for l in open(sys.argv[1])]; b=[json.loads(l)['loss'] for l in open(sys.argv[2])]
print(sys.argv[2].split('/')[-1], 'steps', len(a), len(b), 'worst rel', max(abs(x-y)/max(abs(x),1e-12) for x,y in zip(a,b)), 'last', a[-1], b[-1])
PY
  done
done
