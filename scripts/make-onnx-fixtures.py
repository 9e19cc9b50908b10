#!/usr/bin/env python3
"""Exports the ONNX fixtures of crates/torchlean-onnx/tests/fixtures with PyTorch.

    python3 scripts/make-onnx-fixtures.py [OUT_DIR]

Needs torch, onnx, onnxscript and safetensors (pip). For every model it writes:

  NAME.onnx                  torch.onnx.export of a wrapper (inputs..., target) -> (prediction, loss)
  NAME.inputs.safetensors    the fixed inputs (float32; boolean masks as 0/1 float32)
  NAME.expected.safetensors  PyTorch's outputs for them (`prediction`, `loss`) and the
                             gradients of `loss` for every parameter (`grad.<parameter name>`),
                             the names `torchlean run-graph --grad` writes

The models are small on purpose (the files are committed): an MLP, a CNN with batch norm and
pooling (eval mode, running statistics set to non-trivial values), and a transformer encoder
layer with a padding mask. The loss is the mean squared error against a fixed target, so
that `--grad` has a scalar to differentiate.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = sys.argv[1] if len(sys.argv) > 1 else "crates/torchlean-onnx/tests/fixtures"
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
    """One post-norm encoder layer with a padding mask given as an additive float mask (0 for a
    real token, -inf for padding; PyTorch adds float masks to the scores). A boolean mask
    would reach ONNX as a comparison (`Less`), which torchlean's f32 vocabulary lacks."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )

    def forward(self, x, pad):
        return self.layer(x, src_key_padding_mask=pad)


def randomize_batch_norm(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def export(name, net, inputs, input_names, target_shape, train=False):
    gen = torch.Generator().manual_seed(7)
    randomize_batch_norm(net, gen)
    net.train(train)
    model = WithLoss(net)
    target = torch.randn(*target_shape, generator=gen)
    args = tuple(inputs) + (target,)
    names = list(input_names) + ["target"]
    path = os.path.join(OUT, f"{name}.onnx")
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
        # unnamed initializers and merges equal initializers: the parameters would no longer
        # be the model's, and their gradients could not be compared
        optimize=False,
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
    export("mlp", Mlp(), [torch.randn(8, 20, generator=gen)], ["x"], (8, 10))
    export("cnn", Cnn(), [torch.randn(4, 1, 16, 16, generator=gen)], ["x"], (4, 10))
    pad = torch.zeros(2, 10)
    pad[0, 7:] = float("-inf")  # the first sequence has three padding tokens
    # train mode with dropout 0: the same function as eval, without the fused fast path
    export("encoder", Encoder(), [torch.randn(2, 10, 32, generator=gen), pad],
           ["x", "pad"], (2, 10, 32), train=True)


if __name__ == "__main__":
    main()
