# Sourced by the GPU scripts: `examples_against_cpu EX...` trains each example 20 steps on the
# cpu, then on cuda in eager and compiled mode, and prints the worst relative difference of
# the 20 losses to the CPU's (issue 11: within 1e-4). Needs $log and gpu-bin/torchlean.
examples_against_cpu() {
  local ex m rc
  for ex in "$@"; do
    timeout 120 gpu-bin/torchlean $ex --steps 20 --log-every 1 --device cpu > $log/$ex.cpu.txt 2>&1
    for m in eager compiled; do
      timeout 120 gpu-bin/torchlean $ex --steps 20 --log-every 1 --device cuda --backend $m > $log/$ex.$m.txt 2>&1; rc=$?
      if [ $rc -ne 0 ]; then echo "$ex $m rc=$rc: $(tail -c 300 $log/$ex.$m.txt | tr '\n' ' ')"; continue; fi
      paste <(grep -o "loss [0-9.]*" $log/$ex.cpu.txt | head -20) <(grep -o "loss [0-9.]*" $log/$ex.$m.txt | head -20) \
        | awk -v n="$ex $m" '{d=$2-$4; if (d<0) d=-d; r=d/($2>1e-9?$2:1); if (r>w) w=r} END {printf "%s: %d losses, worst relative difference to the CPU %.2e\n", n, NR, w}'
    done
  done
}
