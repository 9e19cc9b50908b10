"""PyTorch twins of `torchlean bench` workloads: same shapes, float32, same optimizer.

Usage: python bench.py WORKLOAD [--reps N] [--warmup N] [--device cpu|cuda]
Prints one JSON object: workload, unit, median, min, max (same units as torchlean).
"""
import argparse
import json
import statistics
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def timed(fn, warmup, reps, sync, warmup_seconds=0.5):
    start, done = time.perf_counter(), 0
    while done < warmup or time.perf_counter() - start < warmup_seconds:
        fn()
        sync()
        done += 1
    out = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - s)
    out.sort()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--backend", default="eager", help="accepted for symmetry; PyTorch runs eagerly")
    p.add_argument("--compile", action="store_true", help="transformer workloads: torch.compile the model")
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    w = a.workload
    scale, unit, details = 1e3, "ms", {}
    if w.startswith("gemm-"):
        n = int(w[5:])
        x = torch.randn(n, n, device=dev)
        y = torch.randn(n, n, device=dev)
        with torch.no_grad():
            t = timed(lambda: x @ y, a.warmup, a.reps, sync)
        details = {"n": n, "gflops": 2 * n**3 / t[len(t) // 2] / 1e9}
    elif w.startswith("add-"):
        n = int(w[4:])
        x = torch.randn(n, device=dev)
        y = torch.randn(n, device=dev)
        with torch.no_grad():
            t = timed(lambda: x + y, a.warmup, a.reps, sync)
        details = {"n": n, "gb_per_s": 12 * n / t[len(t) // 2] / 1e9}
    elif w in ("mlp-step", "mlp-big-step"):
        hidden = 2048 if w == "mlp-big-step" else 512
        model = torch.nn.Sequential(
            torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
        ).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        batch = a.batch_size or (4096 if w == "mlp-big-step" else 128)
        x = torch.randn(batch, 784, device=dev)
        y = (torch.arange(batch, device=dev) % 10).long()
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        t = timed(step, a.warmup, a.reps, sync)
        details = {"batch": batch, "layers": [784, hidden, hidden, 10]}
    elif w in ("transformer-step", "transformer-big-step"):
        # pre-norm encoder, GELU FFN, Adam, MSE on the output; transformer-step: 2 layers, d=128, 4 heads,
        # FFN 512, L=64, batch 16; transformer-big-step (issue 11's GPU workload): 6 layers, d=512, 8 heads,
        # FFN 2048, L=512, batch 16. --compile: the step's forward and backward under torch.compile.
        layers, d, heads, ff, l, batch = (6, 512, 8, 2048, 512, 16) if w == "transformer-big-step" else (2, 128, 4, 512, 64, 16)
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

        t = timed(step, a.warmup, a.reps, sync)
        details = {"layers": layers, "d": d, "heads": heads, "ff": ff, "L": l, "batch": batch, "compiled": a.compile}
    elif w == "sdpa":
        b, h, l, d = 4, 8, 512, 64
        q = torch.randn(b, h, l, d, device=dev, requires_grad=True)
        k = torch.randn(b, h, l, d, device=dev, requires_grad=True)
        v = torch.randn(b, h, l, d, device=dev, requires_grad=True)
        mask = torch.ones(l, l, dtype=torch.bool, device=dev).tril()
        g = torch.randn(b, h, l, d, device=dev)

        def attn():
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            (o * g).sum().backward()

        t = timed(attn, a.warmup, a.reps, sync)
        details = {"B": b, "H": h, "L": l, "D": d, "mask": "boolean"}
    elif w.startswith("attn-"):
        # attn-{fwd|step}-{none|mask|causal}[-L<n>][-B<n>]: q, k, v [B, 16, L, 64] (B=8, L=2048 by default),
        # forward only or forward + backward, no mask / boolean lower-triangular [L, L] mask / is_causal
        parts = w.split("-")[1:]
        backward, kind = parts[0] == "step", parts[1]
        b, h, l, d = 8, 16, 2048, 64
        for p in parts[2:]:
            if p[0] == "L":
                l = int(p[1:])
            elif p[0] == "B":
                b = int(p[1:])
        q, k, v, g = (torch.randn(b, h, l, d, device=dev, requires_grad=backward) for _ in range(4))
        g = g.detach()
        mask = torch.ones(l, l, dtype=torch.bool, device=dev).tril() if kind == "mask" else None
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()

        def attn():
            if backward:
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")
                (o * g).sum().backward()
            else:
                with torch.no_grad():
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")

        t = timed(attn, a.warmup, a.reps, sync)
        details = {"B": b, "H": h, "L": l, "D": d, "mask": kind, "backward": backward,
                   "peak_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None}
    elif w == "quickstart-step":
        model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(a.batch_size or 16, 4, device=dev)
        y = torch.randn(a.batch_size or 16, 1, device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        t = timed(step, a.warmup, a.reps, sync)
        details = {"batch": a.batch_size or 16, "layers": [4, 64, 64, 1]}
    elif w in ("tiny-ops", "tiny-ops-tape"):
        x = torch.randn(16, device=dev, requires_grad=(w == "tiny-ops-tape"))
        y = torch.randn(16, device=dev)

        def ops():
            for _ in range(1000):
                x + y

        t = timed(ops, a.warmup, a.reps, sync)
        unit = "us/op"  # 1000 ops per rep: ms per rep == us per op
        details = {"ops_per_rep": 1000, "tape": w == "tiny-ops-tape"}
    else:
        raise SystemExit(f"unknown workload {w}")
    print(json.dumps({"workload": w, "unit": unit, "median": statistics.median(t) * scale, "min": t[0] * scale, "max": t[-1] * scale,
                      "reps": a.reps, "details": details, "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
