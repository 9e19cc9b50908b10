#!/usr/bin/env python3
"""Models as users export them: small PyTorch modules of the layers common in real networks,
exported with `torch.onnx.export(..., dynamo=True)` at its defaults (external data included),
run by `torchlean run-graph MODEL.onnx` under each profile and compared with PyTorch's own
outputs (and, with --grad, the input gradients of a fixed loss against PyTorch's autograd).
A refusal is reported apart with its reason: it is not a wrong answer, but each is a model a
user could not run.

    python3 -m venv .oracle-venv && .oracle-venv/bin/pip install torch numpy onnx onnxscript
    .oracle-venv/bin/python scripts/onnx-export-zoo.py [--torchlean target/release/torchlean] [--profiles checked_cpu,strict_native_cpu]

Exits 1 if an output disagrees.
"""
import argparse, os, shutil, subprocess, sys, tempfile, warnings, logging
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import write_st, read_st, close

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--torchlean", default="target/release/torchlean")
ap.add_argument("--profiles", default="checked_cpu,strict_cpu,strict_native_cpu")
ap.add_argument("--only", default="")
ARGS = ap.parse_args()
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
torch.manual_seed(0)
WORK = tempfile.mkdtemp(prefix="torchlean-zoo-")
FAILS, REFUSED, PASSED = [], [], []


class Seq(nn.Module):
    def __init__(self, *layers):
        super().__init__(); self.net = nn.Sequential(*layers)
    def forward(self, x):
        return self.net(x)


class Fn(nn.Module):
    """A module from a function of the input and its own parameter-holding layers."""
    def __init__(self, f, **layers):
        super().__init__(); self.f = f; self.layers = nn.ModuleDict(layers)
    def forward(self, *xs):
        return self.f(self.layers, *xs)


def zoo():
    c = lambda *a, **k: nn.Conv2d(*a, **k)
    yield "cnn leaky_relu", Seq(c(3, 8, 3, padding=1), nn.LeakyReLU(0.1), nn.MaxPool2d(2), c(8, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)), (torch.randn(2, 3, 16, 16),)
    yield "activations", Seq(nn.Linear(8, 16), nn.ELU(), nn.Linear(16, 16), nn.SELU(), nn.Linear(16, 16), nn.Hardswish(), nn.Linear(16, 16), nn.Hardsigmoid(), nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16), nn.Mish(), nn.Linear(16, 4), nn.Softsign()), (torch.randn(5, 8),)
    yield "prelu", Seq(nn.Linear(8, 16), nn.PReLU(16), nn.Linear(16, 4), nn.PReLU()), (torch.randn(5, 8),)
    yield "gelu tanh", Seq(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 4)), (torch.randn(5, 8),)
    yield "conv padding same", Seq(c(3, 6, 4, padding="same"), nn.ReLU(), c(6, 6, 3, padding="same", dilation=2), nn.AdaptiveAvgPool2d(1), nn.Flatten()), (torch.randn(2, 3, 9, 10),)
    yield "maxpool ceil_mode", Seq(c(3, 4, 3), nn.MaxPool2d(3, 2, ceil_mode=True), nn.Flatten()), (torch.randn(2, 3, 12, 12),)
    yield "reflection pad", Seq(nn.ReflectionPad2d(2), c(3, 4, 3), nn.ReplicationPad2d((1, 0, 2, 1)), nn.ReLU()), (torch.randn(2, 3, 8, 8),)
    yield "upsample nearest", Seq(c(3, 4, 3, padding=1), nn.Upsample(scale_factor=2, mode="nearest"), c(4, 2, 3, padding=1)), (torch.randn(2, 3, 6, 6),)
    yield "upsample bilinear", Seq(c(3, 4, 3, padding=1), nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)), (torch.randn(2, 3, 6, 6),)
    yield "batchnorm1d + dropout (eval)", Seq(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3)), (torch.randn(6, 8),)
    yield "groupnorm", Seq(c(4, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU()), (torch.randn(2, 4, 6, 6),)
    yield "instancenorm", Seq(c(4, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True), nn.ReLU()), (torch.randn(2, 4, 6, 6),)
    yield "layernorm over two axes", Seq(nn.LayerNorm([4, 6])), (torch.randn(3, 4, 6),)
    yield "embedding + mean", Fn(lambda L, ids: L["fc"](L["emb"](ids).mean(1)), emb=nn.Embedding(20, 8), fc=nn.Linear(8, 3)), (torch.randint(0, 20, (4, 7)),)
    yield "lstm last step", Fn(lambda L, x: L["fc"](L["rnn"](x)[0][:, -1]), rnn=nn.LSTM(5, 8, batch_first=True), fc=nn.Linear(8, 2)), (torch.randn(3, 6, 5),)
    yield "gru two layers", Fn(lambda L, x: L["rnn"](x)[0], rnn=nn.GRU(5, 8, num_layers=2, batch_first=True)), (torch.randn(3, 6, 5),)
    yield "bidirectional lstm", Fn(lambda L, x: L["rnn"](x)[0], rnn=nn.LSTM(5, 8, batch_first=True, bidirectional=True)), (torch.randn(3, 6, 5),)
    yield "bidirectional gru, two layers, last state", Fn(lambda L, x: L["rnn"](x)[1], rnn=nn.GRU(5, 8, num_layers=2, bidirectional=True)), (torch.randn(6, 3, 5),)
    yield "multihead attention", Fn(lambda L, x: L["mha"](x, x, x, need_weights=False)[0], mha=nn.MultiheadAttention(16, 4, batch_first=True)), (torch.randn(2, 5, 16),)
    yield "sdpa causal", Fn(lambda L, q: F.scaled_dot_product_attention(L["q"](q), L["k"](q), L["v"](q), is_causal=True), q=nn.Linear(8, 8), k=nn.Linear(8, 8), v=nn.Linear(8, 8)), (torch.randn(2, 6, 8),)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"), 2, enable_nested_tensor=False)
    yield "transformer encoder (pre-norm, gelu)", Fn(lambda L, x: L["enc"](x), enc=enc), (torch.randn(2, 5, 16),)
    yield "transformer encoder + bool padding mask", Fn(lambda L, x, m: L["enc"](x, src_key_padding_mask=m), enc=nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)), (torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))
    yield "residual block", Fn(lambda L, x: F.relu(L["bn2"](L["c2"](F.relu(L["bn1"](L["c1"](x))))) + x), c1=c(4, 4, 3, padding=1, bias=False), bn1=nn.BatchNorm2d(4), c2=c(4, 4, 3, padding=1, bias=False), bn2=nn.BatchNorm2d(4)), (torch.randn(2, 4, 8, 8),)
    yield "depthwise separable", Seq(c(4, 4, 3, padding=1, groups=4), c(4, 8, 1), nn.ReLU6()), (torch.randn(2, 4, 8, 8),)
    yield "conv1d + avgpool1d", Seq(nn.Conv1d(3, 6, 5, padding=2), nn.ReLU(), nn.AvgPool1d(2), nn.Conv1d(6, 2, 3)), (torch.randn(2, 3, 20),)
    yield "conv transpose", Seq(nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1), nn.Sigmoid()), (torch.randn(2, 4, 5, 5),)
    yield "slicing and flip", Fn(lambda L, x: torch.cat([x[:, ::2], x.flip(1)[:, :3]], 1)), (torch.randn(4, 8),)
    yield "softmax / log_softmax / logsumexp", Fn(lambda L, x: torch.cat([x.softmax(-1), x.log_softmax(0), x.logsumexp(1, keepdim=True)], 1)), (torch.randn(4, 6),)
    yield "reductions", Fn(lambda L, x: torch.cat([x.sum(1), x.mean(1), x.amax(1), x.var(1), x.std(1)])), (torch.randn(3, 5),)
    yield "clamp / abs / sqrt / pow", Fn(lambda L, x: (x.clamp(-0.5, 0.5) + x.abs().sqrt() * x.pow(2)).tanh()), (torch.randn(4, 5),)
    yield "normalize", Fn(lambda L, x: F.normalize(x, dim=1)), (torch.randn(4, 5),)


def run(name, model, args, prof):
    d = tempfile.mkdtemp(dir=WORK)
    path = f"{d}/m.onnx"
    names = [f"in{i}" for i in range(len(args))]
    model.eval()
    try:
        torch.onnx.export(model, args, path, input_names=names, dynamo=True, verbose=False)
    except Exception as e:
        print(f"skipped {name}: PyTorch cannot export it ({str(e).splitlines()[0][:150]})", flush=True)
        return
    with torch.no_grad():
        want = model(*args)
    want = [w.detach().numpy() for w in (want if isinstance(want, (tuple, list)) else [want])]
    write_st(f"{d}/in.st", {n: a.numpy().astype(np.float32) for n, a in zip(names, args)})
    p = subprocess.run([ARGS.torchlean, "run-graph", path, "--inputs", f"{d}/in.st", "--out", f"{d}/out.st", "--profile", prof], capture_output=True, text=True)
    if p.returncode == 2:
        msg = (p.stderr or p.stdout).strip().replace(path, "m.onnx").replace("\n", " | ")
        REFUSED.append((name, prof, msg)); print(f"refused: {name} | {prof} | {msg[:500]}", flush=True); return
    if p.returncode != 0:
        FAILS.append((name, prof)); print(f"FAILED: {name} | {prof} | exit {p.returncode}: {p.stderr[-400:]}", flush=True); return
    import onnx
    outs = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    got = read_st(f"{d}/out.st")
    for o, w in zip(outs, want):
        msg = close(got[o], w, 1e-4, 2e-5) if o in got else f"no output {o}"
        if msg:
            FAILS.append((name, prof)); print(f"DISAGREES: {name} | {prof} | {o}: {msg.replace('ref', 'pytorch')}", flush=True); return
    PASSED.append((name, prof))
    shutil.rmtree(d, ignore_errors=True)


for name, model, args in zoo():
    if ARGS.only and ARGS.only not in name: continue
    for prof in ARGS.profiles.split(","):
        run(name, model, args, prof)
print(f"\n{len(PASSED)} agree, {len(FAILS)} disagree or fail, {len(REFUSED)} refused")
shutil.rmtree(WORK, ignore_errors=True)
sys.exit(1 if FAILS else 0)
