#!/usr/bin/env python3
"""Writes crates/torchlean-cli/tests/fixtures/typed_outputs.* with PyTorch: a model whose
outputs have the element types PyTorch gives them — argmax and topk indices (int64), a
comparison (bool), a float-to-int32 cast, a float64 cast, and a float32 sum — exported to
ONNX, its input, and PyTorch's outputs in their own dtypes (the oracle of
`graph_files.rs::run_graph_writes_each_output_in_the_type_the_model_declares`).

    python3 scripts/make-typed-outputs-fixture.py   # needs torch, onnx, safetensors
"""
import os

import torch
import torch.nn as nn
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "torchlean-cli", "tests", "fixtures")


class Typed(nn.Module):
    def forward(self, x):
        return (
            x.argmax(-1),
            x > 0.25,
            torch.topk(x, 2, dim=-1).indices,
            (x * 4).floor().to(torch.int32),
            x.double(),
            x.sum(-1),
        )


def main():
    gen = torch.Generator().manual_seed(47)
    x = torch.randn(3, 5, generator=gen)
    names = ["indices", "positive", "top2", "quarters", "wide", "total"]
    path = os.path.join(OUT, "typed_outputs")
    torch.onnx.export(Typed(), (x,), path + ".onnx", input_names=["x"], output_names=names,
                      dynamo=False, do_constant_folding=False, opset_version=17)
    with torch.no_grad():
        outs = Typed()(x)
    save_file({"x": x}, path + ".inputs.safetensors")
    save_file({n: o.contiguous() for n, o in zip(names, outs)}, path + ".expected.safetensors")
    print({n: o.dtype for n, o in zip(names, outs)})


if __name__ == "__main__":
    main()
