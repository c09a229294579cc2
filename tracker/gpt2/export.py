"""Exporting a causal LM (any family `AutoModelForCausalLM` builds) to ONNX (logits only, dynamic batch and
sequence) and checking the export against PyTorch."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import onnx

from tracker.gpt2.model import LoadedLM
from tracker.gpt2.tokens import feeds_for
from tracker.measure.runtimes.ort_runtime import SessionConfig, make_session

logger = logging.getLogger(__name__)

EXPORTERS = ("dynamo", "torchscript")
# The opsets each exporter handles natively (dynamo's translation library targets 18+).
DEFAULT_OPSETS = {"dynamo": 20, "torchscript": 17}
INPUT_NAMES = ("input_ids",)
OUTPUT_NAMES = ("logits",)
# fp32 ORT and PyTorch logits agree within ~4e-6 on gpt2-small; 1e-4 separates breakage from float noise.
LOGITS_ATOL = 1e-4
# fp32 rounding grows with the scale of the logits: Gemma 3 270M's reach |130|, and there PyTorch's own fp32 logits
# are 2e-4..3e-4 from its float64 ones (ORT's as close), so the bound is also 1e-5 of the largest |logit| (1.3e-3
# there: 3x that noise); a broken export is off by 1e-2 of it or more.
LOGITS_RTOL = 1e-5


@dataclass(frozen=True)
class ExportedFile:
    """An exported ONNX file and how it was made: what the forward export (`ExportResult`) and the decode-ready one
    (`decode.DecoderExport`) both say of theirs.

    Attributes:
        seconds: wall time of the export.
        input_names: the graph's inputs, initializers left out (`exported_graph`).
        node_count: nodes of the main graph.
    """

    path: Path
    opset: int
    seconds: float
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    node_count: int


@dataclass(frozen=True)
class ExportResult(ExportedFile):
    """A logits-only export (`export_gpt2`) and the exporter that made it (one of `EXPORTERS`)."""

    exporter: str


@dataclass(frozen=True)
class ExportCheck:
    """ORT logits vs PyTorch logits on the same tokens.

    Attributes:
        max_abs: largest absolute logits difference.
        passed: `max_abs` <= `atol`.
        atol: the bound held: the given atol, or rtol times the largest |logit| of PyTorch when that is larger.
    """

    max_abs: float
    passed: bool
    atol: float


def export_gpt2(
    loaded: LoadedLM,
    path: str | Path,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    example_seq_len: int = 8,
) -> ExportResult:
    """Exports `loaded.model` to ONNX: `input_ids` int64 [batch, seq] -> `logits` [batch, seq, vocab].

    Batch and sequence are dynamic; there are no past key/values (use_cache=False). The file is a
    single .onnx unless the weights exceed protobuf's 2 GB limit (then external data beside it).

    Args:
        loaded: the model to export.
        path: the .onnx file to write.
        exporter: one of EXPORTERS: "dynamo" (torch.export based) or "torchscript" (legacy tracer).
        opset: ONNX opset; default DEFAULT_OPSETS[exporter].
        example_seq_len: sequence length of the example input traced through the model.

    Raises:
        ValueError: unknown exporter, or example_seq_len outside [2, max_positions].
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    n_positions = loaded.max_positions
    if not 2 <= example_seq_len <= n_positions:
        # A size-1 example dim would be specialized to 1 by torch.export.
        raise ValueError(f"example_seq_len must be in [2, {n_positions}], got {example_seq_len}")
    import torch

    opset = DEFAULT_OPSETS[exporter] if opset is None else opset
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = _logits_only(loaded.model)
    generator = torch.Generator().manual_seed(0)
    example = torch.randint(0, loaded.vocab_size, (2, example_seq_len), generator=generator, dtype=torch.int64)
    logger.info("exporting %s (%s) with %s, opset %d, to %s...", loaded.family, loaded.source, exporter, opset, path)
    start = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        # Expected: transformers' Python-side shape checks are traced as constants; the dynamic-shape
        # runs in the tests are what show the graph generalizes.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # The legacy exporter is chosen knowingly (a comparison point for the dynamo export), and the
        # advanced indexing it warns about is the causal mask's, whose indices come from arange (>= 0).
        warnings.filterwarnings("ignore", "You are using the legacy TorchScript", DeprecationWarning)
        warnings.filterwarnings("ignore", "The feature will be removed", DeprecationWarning)
        warnings.filterwarnings("ignore", "Exporting aten::index operator", UserWarning)
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=n_positions)
            program = torch.onnx.export(
                wrapper,
                (example,),
                dynamo=True,
                opset_version=opset,
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES),
                dynamic_shapes={"input_ids": {0: batch, 1: seq}},
                verbose=False,
            )
            assert program is not None  # dynamo=True returns the program
            # external_data=False: one file; torch still switches to external data above 2 GB.
            program.save(path, external_data=False)
        else:
            torch.onnx.export(
                wrapper,
                (example,),
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES),
                dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
            )
    seconds = time.perf_counter() - start
    result = ExportResult(path=path, exporter=exporter, opset=opset, seconds=seconds, **exported_graph(path))
    logger.info("done in %.1f s: %d nodes, %.1f MB", seconds, result.node_count, path.stat().st_size / 1e6)
    return result


class ExportedGraph(TypedDict):
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    node_count: int


def exported_graph(path: Path) -> ExportedGraph:
    """What an `ExportedFile` says of the file written: `input_names` (initializers left out), `output_names` and
    `node_count`."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    return {
        "input_names": tuple(i.name for i in graph.input if i.name not in initializers),
        "output_names": tuple(o.name for o in graph.output),
        "node_count": len(graph.node),
    }


def verify_export(
    loaded: LoadedLM,
    onnx_path: str | Path,
    tokens: np.ndarray,
    *,
    atol: float = LOGITS_ATOL,
    rtol: float = LOGITS_RTOL,
) -> ExportCheck:
    """Runs ORT and PyTorch on `tokens` and compares the logits; a mismatch is data, not an exception.

    Args:
        loaded: the model the file was exported from.
        onnx_path: the exported file.
        tokens: int64 token ids [batch, seq_len].
        atol: largest absolute logits difference that passes, whatever the logits' scale.
        rtol: the same, as a fraction of PyTorch's largest |logit| (fp32 noise grows with it); the larger bound holds.

    Raises:
        ModelError: ONNX Runtime refuses the file.
        FeedError: the file's inputs are not ones feeds_for can fill.
    """
    import torch

    session = make_session(onnx_path, SessionConfig())
    feeds = feeds_for(tokens, [i.name for i in session.get_inputs()])
    ort_logits = session.run(None, feeds)[0]
    with torch.no_grad():
        torch_logits = loaded.model(input_ids=torch.from_numpy(np.asarray(tokens)), use_cache=False).logits.numpy()
    if ort_logits.shape != torch_logits.shape:
        logger.warning("logits shapes differ: onnx %s, torch %s", ort_logits.shape, torch_logits.shape)
        return ExportCheck(max_abs=float("inf"), passed=False, atol=atol)
    max_abs = float(np.max(np.abs(ort_logits.astype(np.float64) - torch_logits)))
    bound = max(atol, rtol * float(np.max(np.abs(torch_logits))))
    check = ExportCheck(max_abs=max_abs, passed=bool(max_abs <= bound), atol=bound)
    logger.info("export check: max |onnx - torch| = %.3g (bound %.3g): %s", max_abs, bound,
                "ok" if check.passed else "FAILED")
    return check


def _logits_only(model):
    """`model` wrapped as `input_ids -> logits`, the signature both exporters trace.

    The all-ones attention mask is built inside the graph, not an input: without any mask transformers
    5 detects packed sequences from position ids with `torch.diff`, which the torchscript exporter
    cannot export (aten::diff), and which adds ~20 useless nodes to the dynamo graph.
    """
    import torch  # here, not at module level: torch is optional for the rest of the tracker

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

    return LogitsOnly().eval()
