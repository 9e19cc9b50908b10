#!/bin/bash
# On the GPU machine (forty-fifth session): the GPU conformance binary (its table now holds
# the `compare` rows: every relation, special values, broadcast, the launch queue's sizes),
# then the PyTorch fixture `masked` (SDPA with a boolean mask, torch.where(h > 0), masked_fill,
# isnan | isinf: compare ops and the boolean-mask attention) run on CUDA with --grad under
# checked_cuda and its outputs and gradients compared with PyTorch's stored values. Logs in
# $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run45; mkdir -p $log; cp $dest/gpu.txt $log/
gpu_tests 200
F=crates/torchlean-onnx/tests/fixtures
for prof in checked_cuda strict_native_cuda; do
  timeout 60 gpu-bin/torchlean run-graph $F/masked.onnx --inputs $F/masked.inputs.safetensors \
    --out $log/masked.$prof.safetensors --grad --profile $prof --show-backend > $log/masked.$prof.txt 2>&1
  echo "masked under $prof: rc=$?"; grep -E "compare|scaled_dot" $log/masked.$prof.txt | grep -v "^  " | head -4
  python3 - $F/masked.expected.safetensors $log/masked.$prof.safetensors <<'PY'
import json, struct, sys
def read(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']; raw = b[8 + n + s:8 + n + e]
        out[k] = struct.unpack('<%df' % (len(raw) // 4), raw)
    return out
want, got = read(sys.argv[1]), read(sys.argv[2])
worst = 0.0
for k, w in want.items():
    g = got.get(k)
    if g is None: print('  missing', k); continue
    m = max(abs(x) for x in w) if w else 0.0
    worst = max(worst, max(abs(a - b) for a, b in zip(g, w)) / (1 + m))
print('  worst relative difference from PyTorch over %d values: %.3g' % (len(want), worst))
PY
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
