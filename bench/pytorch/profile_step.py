"""Where PyTorch's transformer-big-step spends its GPU time: the CUDA kernels of a few steps
grouped by name (torch.profiler), total per step, largest first. Used beside torchlean's
`TORCHLEAN_OP_TIMES=1 torchlean bench transformer-big-step --device cuda` to see which part of
the step is the gap. Same model as bench.py's transformer-big-step.

    python3 bench/pytorch/profile_step.py [--steps 5] [--top 30] [--compile]
"""
import argparse
import torch
from torch.profiler import profile, ProfilerActivity

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--top", type=int, default=30)
p.add_argument("--compile", action="store_true", help="the model under torch.compile (as bench.py --compile)")
a = p.parse_args()
dev = torch.device("cuda")
layers, d, heads, ff, l, batch = 6, 512, 8, 2048, 512, 16
layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=ff, dropout=0.0,
                                         activation="gelu", batch_first=True, norm_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(batch, l, d, device=dev)
target = torch.randn(batch, l, d, device=dev)
forward = torch.compile(model) if a.compile else model


def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(forward(x), target).backward()
    opt.step()


for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
rows = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        r = rows.setdefault(e.name[:110], [0, 0.0])
        r[0] += 1
        r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
total = sum(r[1] for r in rows.values())
print(f"PyTorch transformer-big-step{' (torch.compile)' if a.compile else ''}: GPU kernel time per step {total / a.steps / 1e3:.2f} ms over {a.steps} steps")
for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[: a.top]:
    print(f"{t / a.steps / 1e3:8.3f} ms/step {n // a.steps:5d} calls/step  {name}")
