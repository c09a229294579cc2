"""Exporting a causal LM of a known family (GPT-2 or LLaMA family: `families.FAMILIES`) ready to decode (past
key/values in, present key/values out) and checking it against PyTorch over a prompt and greedy steps."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.base.errors import ModelError
from tracker.gpt2.export import ExportedFile, exported_graph
from tracker.gpt2.families import family_support
from tracker.gpt2.model import LoadedLM
from tracker.measure.generation.decoder import INPUT_IDS, LOGITS, DecoderSession, past_names, present_name
from tracker.measure.runtimes.ort_runtime import SessionConfig

logger = logging.getLogger(__name__)

# The dynamo exporter's translation library targets opset 18+, as for the forward export.
DECODE_OPSET = 20
# fp32 ORT and PyTorch agree within a few 1e-6 on one forward; steps against a cache add no error of their own.
# 1e-3 is the bound the generation check is asked for: well above float noise, well below any real breakage.
DECODE_ATOL = 1e-3


@dataclass(frozen=True)
class DecoderExport(ExportedFile):
    """A decode-ready ONNX file (always the dynamo exporter's), how it was made, and the shape of its cache.

    Attributes:
        num_heads: attention (query) heads per layer.
        kv_heads: heads of the past and present key/values: fewer than `num_heads` with grouped-query attention.
        max_positions: the model's position table: a prompt plus everything generated must fit in it.
    """

    n_layer: int
    num_heads: int
    kv_heads: int
    head_dim: int
    max_positions: int


@dataclass(frozen=True)
class DecoderCheck:
    """ORT's decode-ready model against PyTorch over a prompt and greedy steps.

    Attributes:
        steps: next-token predictions compared (the prompt pass's, then one per step).
        tokens_match: ORT's argmax equals PyTorch's greedy token at every step.
        max_abs: largest absolute logits difference over all steps.
        max_abs_by_step: the same, step by step.
        torch_tokens: PyTorch's greedy tokens [batch, steps].
        onnx_tokens: ORT's argmax at each step, fed PyTorch's tokens [batch, steps].
        atol: the bound `max_abs` is held to.
        passed: tokens match and `max_abs` <= `atol`.
    """

    steps: int
    tokens_match: bool
    max_abs: float
    max_abs_by_step: tuple[float, ...]
    torch_tokens: np.ndarray
    onnx_tokens: np.ndarray
    atol: float
    passed: bool


def export_decoder(
    loaded: LoadedLM,
    path: str | Path,
    *,
    opset: int = DECODE_OPSET,
    example_seq_len: int = 5,
    example_past_len: int = 3,
) -> DecoderExport:
    """Exports `loaded.model` ready to decode, with the dynamo exporter.

    Inputs: `input_ids` int64 [batch, seq] and `past_key_values.{i}.key/value` float [batch, heads, past, head_dim]
    per layer; outputs: `logits` [batch, seq, vocab] and `present.{i}.key/value` [batch, heads, past + seq, head_dim]
    (heads: the model's key/value heads, `loaded.kv_heads`).
    Batch, seq and past are dynamic; a past of length 0 is the prompt pass. Positions (past .. past + seq - 1) and
    the all-ones attention mask are made inside the graph, so rows must be unpadded and of one length.

    Args:
        loaded: the model to export.
        path: the .onnx file to write.
        opset: ONNX opset.
        example_seq_len, example_past_len: lengths of the example traced (>= 2: torch.export specializes sizes 0
            and 1; the past of length 0 is then checked at run time, not traced).

    Raises:
        ModelError: the model is not of a known family (`families.family_support`): its decode-ready export is not
            checked, and the message says why.
        ValueError: an example length < 2, or the two together longer than the model's positions.
    """
    support = family_support(loaded.config)
    if not support.known:
        raise ModelError(f"no decode-ready export of {loaded.source}: {support.reason}")
    n_positions = loaded.max_positions
    if min(example_seq_len, example_past_len) < 2 or example_seq_len + example_past_len > n_positions:
        raise ValueError(f"example lengths must be >= 2 and fit in {n_positions} positions together, got seq "
                         f"{example_seq_len} and past {example_past_len}")
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_layer, heads, head_dim = loaded.n_layer, loaded.kv_heads, loaded.head_dim
    inputs = (INPUT_IDS, *past_names(n_layer))
    outputs = (LOGITS, *(present_name(p) for p in past_names(n_layer)))
    generator = torch.Generator().manual_seed(0)
    example_ids = torch.randint(0, loaded.vocab_size, (2, example_seq_len), generator=generator, dtype=torch.int64)
    example_past = [torch.randn(2, heads, example_past_len, head_dim, generator=generator) for _ in range(2 * n_layer)]
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq", max=n_positions)
    past = torch.export.Dim("past", min=0, max=n_positions - 1)
    dynamic_shapes = {"input_ids": {0: batch, 1: seq}, "past": [{0: batch, 2: past}] * (2 * n_layer)}
    logger.info("exporting %s (%s) ready to decode, opset %d, to %s...", loaded.family, loaded.source, opset, path)
    start = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        # Expected: the batch and past dims of every past input are one dim each, which the exporter says once per
        # input; and torch's own use of a deprecated pytree class.
        warnings.filterwarnings("ignore", "# The axis name", UserWarning)
        warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)
        program = torch.onnx.export(
            _decoder_module(loaded.model),
            (example_ids, example_past),
            dynamo=True,
            opset_version=opset,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
        assert program is not None  # dynamo=True returns the program
        # The rotary tables `shared_kv` writes for LLaMA-family attention need as many rows as the model has positions.
        program.model.metadata_props["max_positions"] = str(n_positions)
        program.save(path, external_data=False)
    seconds = time.perf_counter() - start
    result = DecoderExport(path=path, opset=opset, seconds=seconds, n_layer=n_layer, num_heads=loaded.num_heads,
                           kv_heads=heads, head_dim=head_dim, max_positions=n_positions, **exported_graph(path))
    logger.info("done in %.1f s: %d nodes, %.1f MB", seconds, result.node_count, path.stat().st_size / 1e6)
    return result


def torch_greedy(loaded: LoadedLM, prompt: np.ndarray, steps: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """PyTorch's own greedy decoding with its own cache (transformers' DynamicCache): the tokens [batch, steps] and
    the next-token logits [batch, vocab] of every step."""
    import torch
    from transformers import DynamicCache

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64))
    cache = DynamicCache()
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            out = loaded.model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.cache
            next_logits = out.logits[:, -1, :]
            ids = next_logits.argmax(dim=-1, keepdim=True)
            tokens.append(ids[:, 0].numpy())
            logits.append(next_logits.numpy())
    return np.stack(tokens, axis=1).astype(np.int64), logits


def verify_decoder(
    loaded: LoadedLM,
    onnx_path: str | Path,
    prompt: np.ndarray,
    *,
    steps: int = 16,
    atol: float = DECODE_ATOL,
    session: SessionConfig | None = None,
) -> DecoderCheck:
    """Compares ORT's decode-ready model with PyTorch over `prompt` and greedy steps; a mismatch is data.

    PyTorch decodes greedily; ORT is fed the same tokens one at a time against its own cache, so every step's
    logits are comparable even after a mismatch. When ORT's argmax equals PyTorch's token at every step, ORT's own
    greedy decoding makes exactly these tokens (by induction over the steps).

    Args:
        loaded: the model the file was exported from.
        onnx_path: the decode-ready export.
        prompt: int64 token ids [batch, seq].
        steps: next-token predictions compared: the prompt pass's, then steps - 1 one-token steps.
        atol: largest absolute logits difference that passes.
        session: ONNX Runtime settings (default `SessionConfig()`).

    Raises:
        ValueError: the file is not decode-ready, or the prompt and steps exceed the model's positions.
        ModelError: ONNX Runtime refuses the file.
    """
    prompt = np.asarray(prompt)
    if prompt.shape[-1] + steps > loaded.max_positions:
        raise ValueError(f"a prompt of {prompt.shape[-1]} and {steps} steps exceed the model's "
                         f"{loaded.max_positions} positions")
    torch_tokens, torch_logits = torch_greedy(loaded, prompt, steps)
    decoder = DecoderSession.open(onnx_path, session or SessionConfig())
    onnx_logits = decoder.forced_logits(prompt, torch_tokens)
    by_step = tuple(float(np.max(np.abs(o.astype(np.float64) - t))) for o, t in zip(onnx_logits, torch_logits,
                                                                                   strict=True))
    onnx_tokens = np.stack([o.argmax(axis=-1) for o in onnx_logits], axis=1).astype(np.int64)
    tokens_match = bool(np.array_equal(onnx_tokens, torch_tokens))
    max_abs = max(by_step)
    check = DecoderCheck(steps, tokens_match, max_abs, by_step, torch_tokens, onnx_tokens, atol,
                         bool(tokens_match and max_abs <= atol))
    logger.info("decoder check over %d steps: tokens %s, max |onnx - torch| = %.3g (atol %g): %s", steps,
                "match" if tokens_match else "DIFFER", max_abs, atol, "ok" if check.passed else "FAILED")
    return check


def _decoder_module(model):
    """The module the exporter traces: flat past tensors in (a DynamicCache is rebuilt from them), logits and flat
    presents out."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PastLayer(DynamicLayer):
        """A cache layer holding a given past. Its length is the tensor's (DynamicLayer says 0 for an empty
        tensor through `numel() == 0`, a data-dependent branch torch.export would specialize on)."""

        keys: torch.Tensor  # given at once, never None as in a DynamicLayer not yet filled

        def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            super().__init__()
            self.keys, self.values = keys, values
            self.device, self.is_initialized = keys.device, True

        def get_seq_length(self) -> int:
            return self.keys.shape[-2]

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, past: list[torch.Tensor]):
            cache = DynamicCache()
            cache.layers = [PastLayer(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
            # all ones, built here: no padding, and no mask would make transformers look for packed
            # sequences in the positions (torch.diff); see export._logits_only
            mask = torch.ones((input_ids.shape[0], past[0].shape[2] + input_ids.shape[1]), dtype=torch.int64)
            out = self.model(input_ids=input_ids, attention_mask=mask, cache=cache, use_cache=True)
            presents = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
            return (out.logits, *presents)

    return Decoder().eval()
