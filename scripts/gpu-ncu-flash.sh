#!/bin/bash
# On the GPU machine (twenty-sixth session): where the flash kernels spend their time.
# ptxas's register/spill report for the native_cuda kernels (nvcc on the concatenated .cu
# sources, as NVRTC compiles them), then Nsight Compute on attn-step-none's flash kernels
# (one launch each; --clock-control none: the clocks are left alone), and PyTorch's SDPA
# backward kernel beside them. Logs under $OUT (packed into logs.tgz).
source "$(dirname "$0")/gpu-session-start.sh"
mkdir -p $log/ptx
cat crates/torchlean-cuda/kernels/{elementwise,rows,conv,spectral,attention}.cu > $log/ptx/all.cu
nvcc -arch=sm_90 -cubin -std=c++17 -Xptxas -v -o $log/ptx/all.cubin $log/ptx/all.cu > $log/ptx/ptxas.txt 2>&1
grep -A1 -E "Compiling entry function '(flash_[a-z_]*)'" $log/ptx/ptxas.txt | grep -E "flash_|registers|spill" | head -60
W=${W:-attn-step-none}
timeout 300 ncu --clock-control none -k regex:"${KERNELS:-flash_bwd|flash_forward|flash_row}" -c ${COUNT:-4} \
  --set full --import-source no \
  gpu-bin/torchlean bench $W --device cuda --provider prefer:native_cuda --reps 1 > $log/ncu.txt 2>&1
echo "ncu rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|Block Limit|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|L1/TEX Hit|Shared Memory Configuration Size|Dynamic Shared|FMA|One or More" $log/ncu.txt | head -120
grep -iE "stall|warp state" $log/ncu.txt | head -40
timeout 200 ncu --clock-control none -k regex:"fmha|attention|efficient|flash" -c 3 --section SpeedOfLight --section LaunchStats --section Occupancy \
  python3 bench/pytorch/bench.py $W --device cuda --reps 1 > $log/ncu-pt.txt 2>&1
echo "ncu pytorch rc=$?"
grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Block Size|Grid Size|Shared Memory Per" $log/ncu-pt.txt | cut -c1-200 | head -40
tar czf $OUT/logs.tgz -C $log .
