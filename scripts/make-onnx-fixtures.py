#!/usr/bin/env python3
"""Exports the ONNX fixtures of crates/torchlean-onnx/tests/fixtures with PyTorch.

    python3 scripts/make-onnx-fixtures.py [OUT_DIR] [--batch N] [--only NAME,NAME]

With --batch N every model is exported for batch N instead of the small test batches (the
inference benchmark uses `bench/onnx`, batch 32: scripts/bench-onnx.sh). With --only, just
the named models (the others' files are left as they are).

Needs torch, onnx, onnxscript and safetensors (pip). For every model it writes:

  NAME.onnx                  torch.onnx.export of a wrapper (inputs..., target) -> (prediction, loss)
  NAME.inputs.safetensors    the fixed inputs (float32; integer token ids as float32 integers)
  NAME.expected.safetensors  PyTorch's outputs for them (`prediction`, `loss`) and the
                             gradients of `loss` for every parameter (`grad.<parameter name>`),
                             the names `torchlean run-graph --grad` writes

The models are small on purpose (the files are committed): an MLP, a CNN with batch norm and
pooling (eval mode, running statistics set to non-trivial values), a transformer encoder
layer with a padding mask, GRU and LSTM sequence regressors, and 1-D and transposed
convolutions (`upsample`). The loss is the mean squared error against a fixed target, so
that `--grad` has a scalar to differentiate.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

ARGS = sys.argv[1:]
BATCH = None
if "--batch" in ARGS:
    i = ARGS.index("--batch")
    BATCH = int(ARGS[i + 1])
    del ARGS[i:i + 2]
ONLY = None
if "--only" in ARGS:
    i = ARGS.index("--only")
    ONLY = ARGS[i + 1].split(",")
    del ARGS[i:i + 2]
OUT = ARGS[0] if ARGS else "crates/torchlean-onnx/tests/fixtures"
OPSET = 18


class WithLoss(nn.Module):
    """(inputs..., target) -> (prediction, mse loss)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, *args):
        *xs, target = args
        prediction = self.net(*xs)
        return prediction, F.mse_loss(prediction, target)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Encoder(nn.Module):
    """One post-norm encoder layer (GELU feed-forward) with a padding mask given as an additive float mask (0 for a
    real token, -inf for padding; PyTorch adds float masks to the scores). A boolean mask
    would reach ONNX as a comparison (`Less`), which torchlean's f32 vocabulary lacks."""

    def __init__(self):
        super().__init__()
        # GELU as in BERT-style layers: exported at opset 18 as Div → Erf → Add → Mul → Mul
        self.layer = nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True,
            activation="gelu",
        )

    def forward(self, x, pad):
        return self.layer(x, src_key_padding_mask=pad)


class EncoderTs(nn.Module):
    """A post-norm `nn.TransformerEncoderLayer` (ReLU feed-forward, no mask) exported by the
    TorchScript exporter (`dynamo=False`), the one older tutorials use: its graph computes
    the attention's shape checks from `Constant`s, a `Mod` among them, which the import must
    evaluate (docs/onnx.md: everything computed only from constants)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True,
        )
        # layer norms away from their initial ones and zeros: the TorchScript exporter
        # merges equal initializers, and each parameter must stay one (its gradient is
        # compared under its name)
        with torch.no_grad():
            for norm in (self.layer.norm1, self.layer.norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.layer(x)


class Gru(nn.Module):
    """A GRU sequence regressor: the last step's hidden state through a linear head.
    PyTorch 2.11 exports nn.GRU as ONNX's GRU operator (torchlean unrolls it)."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 1)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.fc(out[:, -1])


class Lstm(nn.Module):
    """An LSTM sequence regressor (exported as ONNX's LSTM operator, unrolled by torchlean)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.fc = nn.Linear(12, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Elman(nn.Module):
    """Elman RNNs (nn.RNN, exported as ONNX's RNN operator, unrolled by torchlean): a
    bidirectional tanh layer, then two stacked relu layers, the last step through a head."""

    def __init__(self):
        super().__init__()
        self.first = nn.RNN(6, 8, bidirectional=True, batch_first=True)
        self.second = nn.RNN(16, 5, num_layers=2, nonlinearity="relu", batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        out, _ = self.first(x)
        out, _ = self.second(out)
        return self.fc(out[:, -1])


class Indexing(nn.Module):
    """Python indexing and one-hot codes as PyTorch exports them: slice assignment
    (ScatterND), index_put with accumulate (ScatterND add), scatter_add with indices given
    at run time and scatter with constant ones (ScatterElements), F.one_hot (OneHot),
    diagonal (EyeLike, GatherND, an If on shapes) and tile (an If on shapes)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.code = nn.Linear(5, 6)

    def forward(self, x, i, cls):
        h = self.fc(x)
        y = h.clone()
        y[:, 1:3] = h[:, 3:5] * 2.0
        z = h.index_put((torch.tensor([0, 2]),), h[1:2, :].expand(2, 6), accumulate=True)
        s = torch.zeros_like(h).scatter_add(1, i, h[:, :3])
        t = h.scatter(1, torch.tensor([[5, 0, 2], [1, 3, 4], [0, 1, 2]]), h[:, 3:] * h[:, :3])
        o = self.code(F.one_hot(cls, 5).float())
        d = (h[:, :4].T @ h[:, :4]).diagonal()
        tl = h[:, None, :2].tile(1, 2, 1).flatten(1)
        return torch.cat([y, z, s, t, o, tl, d.expand(3, 4)], 1)


class Bicubic(nn.Module):
    """F.interpolate(mode="bicubic") (ONNX Resize, mode cubic): up by 2, to a size with
    align_corners, and a learnable position embedding resized as ViTs do."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.pos = nn.Parameter(torch.randn(1, 3, 4, 4))

    def forward(self, x):
        h = self.conv(x)
        up = F.interpolate(h, scale_factor=2, mode="bicubic", align_corners=False)
        sized = F.interpolate(h, size=(7, 3), mode="bicubic", align_corners=True)
        pos = F.interpolate(self.pos, size=(5, 6), mode="bicubic", align_corners=False)
        return torch.cat([up.flatten(1), sized.flatten(1), (h + pos).flatten(1)], 1)


class EmbeddingBag(nn.Module):
    """Token ids (int64 in PyTorch and ONNX; float32 integers in the inputs file) through an
    embedding, mean-pooled over the sequence, and a linear head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 3)

    def forward(self, ids):
        return self.fc(self.embed(ids).mean(dim=1))


class Attention(nn.Module):
    """Two attention layers written with `F.scaled_dot_product_attention`, as user code and
    `nn.MultiheadAttention`'s fast paths call it: the first with an additive float mask
    (padding keys at -inf), the second causal (`is_causal=True`, which PyTorch's exporter
    writes as a `Trilu` constant turned into a -inf mask). Each is exported as
    Mul(q, √s) · Mul(kᵀ, √s) → Add mask → Softmax → MatMul v, which torchlean's import maps
    to one `scaled_dot_product_attention` node."""

    def __init__(self):
        super().__init__()
        self.qkv1 = nn.Linear(16, 48)
        self.qkv2 = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def heads(self, proj, x):
        b, l, _ = x.shape
        return proj(x).reshape(b, l, 3, 2, 8).permute(2, 0, 3, 1, 4)

    def forward(self, x, mask):
        b, l, _ = x.shape
        q, k, v = self.heads(self.qkv1, x)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, l, 16)
        q, k, v = self.heads(self.qkv2, torch.tanh(h))
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, l, 16)
        return self.out(h)


class Upsample(nn.Module):
    """1-D and transposed convolutions: a Conv1d → ReLU → MaxPool1d → AvgPool1d encoder over
    a sequence, a ConvTranspose1d back up, and a grouped ConvTranspose2d (with output_padding)
    over the result read as an image."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv1d(3, 8, 5, stride=2, padding=2)
        self.pool = nn.MaxPool1d(2)
        self.avg = nn.AvgPool1d(3, stride=1, padding=1, count_include_pad=False)
        self.dec = nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1, groups=2)

    def forward(self, x):
        h = self.avg(self.pool(torch.relu(self.enc(x))))
        d = torch.tanh(self.dec(h))
        return self.up(d.reshape(d.shape[0], 4, 4, 4))


class Masked(nn.Module):
    """Comparisons of float values computed at run time, as user code writes them:
    `F.scaled_dot_product_attention` with a boolean `attn_mask` (exported as the "safe
    softmax" Where(mask, 0, -inf) → Add → Softmax → IsNaN → Where(·, 0)), whose mask blocks a
    whole query row of the first sequence; `torch.where(h > 0, h, 0.1 * h)`;
    `masked_fill(h < -0.5, 0)`; and non-finite values zeroed with `torch.isnan` and
    `torch.isinf` (IsNaN, IsInf, Or, Where). (`torch.nan_to_num` exports a Cast to float64,
    which torchlean refuses.)"""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x, mask):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, l, 3, 2, 8).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, l, 16)
        h = torch.where(h > 0, h, 0.1 * h)
        h = self.out(h).masked_fill(h < -0.5, 0.0)
        return torch.where(torch.isnan(h) | torch.isinf(h), torch.zeros_like(h), h)


class Extras(nn.Module):
    """Operators PyTorch exports that torchlean composes from its ops (forty-fifth session):
    `F.cross_entropy` with class weights and an ignored label (SoftmaxCrossEntropyLoss,
    reduction none), `F.pixel_shuffle` (DepthToSpace, mode CRD), `Tensor.repeat` (Tile),
    `F.celu` (Celu) and `torch.sign` (Sign)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.register_buffer("weight", torch.tensor([0.5, 1.0, 1.5, 2.0, 0.75]))

    def forward(self, x, t):
        b = x.shape[0]
        z = self.lin(x)  # [b, 4, 5]
        ce = F.cross_entropy(z.transpose(1, 2), t, weight=self.weight, reduction="none")
        img = F.pixel_shuffle(self.conv(x.reshape(b, 1, 4, 6)), 2)  # [b, 2, 8, 12]
        act = F.celu(img, alpha=0.7) + 0.25 * torch.sign(img)
        rep = z.repeat(1, 2, 1)  # [b, 8, 5]
        return torch.cat([ce, act.reshape(b, -1)[:, :16], rep.reshape(b, -1)[:, :12]], 1)


class Ranked(nn.Module):
    """Forty-sixth session: `torch.topk` with softmax routing weights over the chosen scores
    (a mixture-of-experts gate: TopK, GatherElements by its indices), `torch.sort` (a TopK over
    the whole axis, smallest first) and its indices as floats, `torch.floor`, `torch.ceil`,
    `torch.round` and `x.long()` (a run-time cast to int64: truncation)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(6, 8)
        self.expert = nn.Linear(6, 8)

    def forward(self, x):
        b = x.shape[0]
        g = self.gate(x)  # [b, 5, 8]
        v, i = torch.topk(g, 2, dim=-1)
        w = torch.softmax(v, -1)
        e = self.expert(x)  # [b, 5, 8]
        routed = (w * torch.gather(e, -1, i)).sum(-1)  # [b, 5]
        s, order = torch.sort(e, dim=-1)
        q = (torch.floor(e * 3) / 3 + torch.ceil(e) * 0.1 + torch.round(e * 2) * 0.05
             + (e * 4).long().float() * 0.01)
        return torch.cat([routed, s[..., 0] + s[..., -1], order.float()[..., 0],
                          q.reshape(b, -1)[:, :10]], 1)


def randomize_batch_norm(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def export(name, net, inputs, input_names, target_shape, train=False, dynamo=True):
    if ONLY is not None and name not in ONLY:
        return
    gen = torch.Generator().manual_seed(7)
    randomize_batch_norm(net, gen)
    net.train(train)
    model = WithLoss(net)
    target = torch.randn(*target_shape, generator=gen)
    args = tuple(inputs) + (target,)
    names = list(input_names) + ["target"]
    path = os.path.join(OUT, f"{name}.onnx")
    if dynamo:
        torch.onnx.export(
            model,
            args,
            path,
            input_names=names,
            output_names=["prediction", "loss"],
            opset_version=OPSET,
            dynamo=True,
            external_data=False,
            # the optimizer folds batch norm into convolutions, transposes weights into new
            # unnamed initializers and merges equal initializers: the parameters would no
            # longer be the model's, and their gradients could not be compared
            optimize=False,
        )
    else:
        # the TorchScript exporter; without constant folding for the same reason
        torch.onnx.export(
            model,
            args,
            path,
            input_names=names,
            output_names=["prediction", "loss"],
            opset_version=17,
            dynamo=False,
            do_constant_folding=False,
        )
    prediction, loss = model(*args)
    model.zero_grad()
    loss.backward()
    expected = {"prediction": prediction.detach(), "loss": loss.detach().reshape([])}
    for pname, p in model.named_parameters():
        if p.grad is not None:
            expected[f"grad.{pname}"] = p.grad.detach().clone()
    save_file({k: v.contiguous().float() for k, v in zip(names, args)},
              os.path.join(OUT, f"{name}.inputs.safetensors"))
    save_file({k: v.contiguous().float() for k, v in expected.items()},
              os.path.join(OUT, f"{name}.expected.safetensors"))
    print(f"wrote {path}")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    b = BATCH or 8
    export("mlp", Mlp(), [torch.randn(b, 20, generator=gen)], ["x"], (b, 10))
    b = BATCH or 4
    export("cnn", Cnn(), [torch.randn(b, 1, 16, 16, generator=gen)], ["x"], (b, 10))
    b = BATCH or 2
    pad = torch.zeros(b, 10)
    pad[0, 7:] = float("-inf")  # the first sequence has three padding tokens
    # train mode with dropout 0: the same function as eval, without the fused fast path
    export("encoder", Encoder(), [torch.randn(b, 10, 32, generator=gen), pad],
           ["x", "pad"], (b, 10, 32), train=True)
    b = BATCH or 4
    export("gru", Gru(), [torch.randn(b, 6, 8, generator=gen)], ["x"], (b, 1))
    export("lstm", Lstm(), [torch.randn(b, 5, 8, generator=gen)], ["x"], (b, 2))
    export("embedding", EmbeddingBag(), [torch.randint(0, 50, (b, 7), generator=gen)], ["ids"], (b, 3))
    b = BATCH or 3
    mask = torch.zeros(b, 1, 1, 6)
    mask[1, :, :, 4:] = float("-inf")  # the second sequence pads its last two keys
    export("attention", Attention(), [torch.randn(b, 6, 16, generator=gen), mask],
           ["x", "mask"], (b, 6, 16))
    b = BATCH or 2
    export("upsample", Upsample(), [torch.randn(b, 3, 32, generator=gen)], ["x"], (b, 2, 8, 8))
    # added later: its own seeds, so the fixtures above stay as they were
    torch.manual_seed(2)
    gen = torch.Generator().manual_seed(2)
    b = BATCH or 2
    export("encoder_ts", EncoderTs(), [torch.randn(b, 5, 16, generator=gen)], ["x"], (b, 5, 16),
           dynamo=False)
    # forty-fifth session: comparisons of float values (torchlean's `compare`)
    torch.manual_seed(3)
    gen = torch.Generator().manual_seed(3)
    b = BATCH or 2
    mask = torch.rand(b, 1, 6, 6, generator=gen) > 0.3
    mask[0, 0, 2, :] = False  # the first sequence's third query sees no key
    mask[:, :, :, 0] |= torch.arange(6) != 2  # every other query sees its first key
    export("masked", Masked(), [torch.randn(b, 6, 16, generator=gen), mask], ["x", "mask"],
           (b, 6, 16), dynamo=False)
    torch.manual_seed(4)
    gen = torch.Generator().manual_seed(4)
    b = BATCH or 3
    labels = torch.randint(0, 5, (b, 4), generator=gen)
    labels[0, 1] = -100  # ignored (F.cross_entropy's default ignore_index)
    export("extras", Extras(), [torch.randn(b, 4, 6, generator=gen), labels], ["x", "t"],
           (b, 32), dynamo=False)
    # forty-sixth session: top-k routing, sorting, rounding (torchlean's `round`)
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(5)
    b = BATCH or 3
    export("ranked", Ranked(), [torch.randn(b, 5, 6, generator=gen)], ["x"], (b, 25),
           dynamo=False)
    # forty-eighth session: ONNX's RNN operator
    torch.manual_seed(6)
    gen = torch.Generator().manual_seed(6)
    b = BATCH or 3
    export("elman", Elman(), [torch.randn(b, 5, 6, generator=gen)], ["x"], (b, 2), dynamo=False)
    torch.manual_seed(7)
    gen = torch.Generator().manual_seed(7)
    export("indexing", Indexing(), [torch.randn(3, 6, generator=gen),
                                    torch.randint(0, 6, (3, 3), generator=gen),
                                    torch.tensor([4, 0, 2])],
           ["x", "i", "cls"], (3, 38), dynamo=False)
    export("bicubic", Bicubic(), [torch.randn(2, 2, 5, 6, generator=gen)], ["x"],
           (2, 3 * 10 * 12 + 3 * 7 * 3 + 3 * 5 * 6), dynamo=False)


if __name__ == "__main__":
    main()
