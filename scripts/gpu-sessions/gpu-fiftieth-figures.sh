#!/bin/bash
# On the GPU machine (fiftieth session: the H200 figures if an H200 came): the figures of issues 11
# and 12 on the session's final code, each beside PyTorch 2.11 on the same machine,
# alternating torchlean and PyTorch per workload. Attention (B=8 H=16 L=2048 D=64, forward
# and forward+backward, no mask / boolean mask / causal), then the issue-11 workloads, then
# flash attention's peak memory at L = 2k, 8k, 32k. Every torchlean JSON keeps its backend
# report. DEADLINE seconds in all (default 540). Logs in $OUT/logs.tgz.
source "$(dirname "$0")/../gpu-session-start.sh"
dest=$log; log=/tmp/run50; mkdir -p $log; cp $dest/gpu.txt $log/
start=$(date +%s); D=${DEADLINE:-540}; left() { echo $(( D - ($(date +%s) - start) )); }
p="--device cuda --provider prefer:native_cuda --json"
for r in 1 2; do
  for w in attn-fwd-none attn-step-none attn-fwd-mask attn-step-mask attn-fwd-causal attn-step-causal; do
    [ $(left) -gt 300 ] && pair $w 20 $w.$r "" ""
  done
done
for r in 1 2; do
  [ $(left) -gt 200 ] && pair gemm-4096 20 gemm.$r "" ""
  [ $(left) -gt 200 ] && pair add-268435456 20 add.$r "" ""
  [ $(left) -gt 200 ] && pair mlp-big-step 50 mlpbig.eager.$r "" ""
  [ $(left) -gt 200 ] && pair mlp-big-step 50 mlpbig.compiled.$r "--backend compiled" ""
  [ $(left) -gt 200 ] && pair tiny-ops 20 tiny.$r "" ""
  [ $(left) -gt 200 ] && pair quickstart-step 50 qs.compiled.$r "--backend compiled" ""
  [ $(left) -gt 200 ] && pair transformer-big-step 10 big.eager.$r "" ""
  [ $(left) -gt 200 ] && pair transformer-big-step 10 big.compiled.$r "--backend compiled" "--compile"
done
for l in 2048 8192 32768; do
  [ $(left) -gt 40 ] && timeout 60 gpu-bin/torchlean bench attn-step-none-L$l-B1 $p --reps 3 --warmup 1 --warmup-seconds 0 > $log/mem.$l.json 2>> $log/err
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d.get("memory") or d.get("details",{}).get("memory"); print("L", sys.argv[2], "median", round(d["median"],3), "memory", m)' $log/mem.$l.json $l 2>/dev/null || echo "L $l: no result"
done
tar czf $dest/logs.tgz -C $log . && rm -f $dest/gpu.txt
