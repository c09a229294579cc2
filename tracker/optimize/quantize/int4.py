"""int4 weight-only quantization: MatMul weights in blocks of 4-bit integers with a float scale each, run by
ORT's `MatMulNBits` (`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, count_ops, float_weights, has_matmul_weights
from tracker.optimize.entry import Entry, EntryError, knob
from tracker.optimize.model_files import prepare_output, save_proto
from tracker.optimize.quantize.block_bias import add_corrections, quantize_matmuls_corrected
from tracker.optimize.quantize.flatten import fold_flattening_reshapes
from tracker.optimize.quantize.float_zero_points import quantize_matmuls
from tracker.optimize.quantize.lm_head import lm_head_node, lm_head_params, products_of, untie_fused_products
from tracker.optimize.quantize.prepare import model_bytes, prepared

# MatMulNBits' accuracy_level 4 computes with int8 activations (quantized per block inside the kernel)
# instead of float32: on GPT-2 small (seq 32, 2 cores) it is 1.47x faster than the baseline where the
# default level is 0.98x, with the same logits difference (FACTS.md, "int4 weight-only on GPT-2").
ACCURACY_LEVEL = 4


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The first import of `matmul_nbits_quantizer` calls `logging.basicConfig(level=INFO)`, which would print
    every INFO record of the process to stderr: the root logger is put back as it was. The quantizer's own
    logger (an INFO line per node) is set to WARNING while it runs."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quantizer_logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    quantizer_level = quantizer_logger.level
    try:
        import onnxruntime.quantization.matmul_nbits_quantizer  # noqa: F401  (its import configures logging)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    quantizer_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        quantizer_logger.setLevel(quantizer_level)


@dataclass(frozen=True)
class Int4(Entry):
    """int4 weight-only MatMul weights (`MatMulNBits`), on the source pre-processed once (`quant_pre_process`,
    without shape inference), with plain Gemms rewritten as MatMul + Add so their weights can be quantized, and
    the Reshapes that only flattened a product's input for its Gemm folded away (`flatten`).

    Knobs: `bits` (4; or 8, `int8_block32`: weight-only int8 in blocks), `block_size` (weights per scale),
    `accuracy_level` (4: int8 compute inside the kernel; 0: fp32), `symmetric` (no zero point), `float_zero_point`
    (the zero point a float, not a 4-bit integer; exact on weights that were on such a grid, but ONNX Runtime 1.32's
    CPU kernel then dequantizes the whole weight each call: ~17x slower), `block_bias` (integer zero points, and each
    block's mean rounding error added back by a float product K / 32 times smaller than the weight: `block_bias`;
    exact on such weights at the integer kernel's speed), `lm_head` (the logits' product: quantized
    `same` as the rest, in `int8` blocks, or left in `fp32`), `int8_modules` (the products of these torch modules in
    int8 blocks), `exclude` (nodes of the pre-processed graph left in fp32).
    """

    name: str = "int4_block32"
    bits: int = knob(4, (4, 8), search=(4,), short="bits")
    block_size: int = knob(32, (16, 32, 64, 128), search=(32, 128), short="b")
    accuracy_level: int = knob(ACCURACY_LEVEL, (0, 1, 2, 3, 4), search=(0, 4), short="acc")
    symmetric: bool = knob(True, (False, True), short="sym")
    # A zero point per block as a float, not a 4-bit integer (`float_zero_points`): asymmetric blocks only.
    float_zero_point: bool = knob(False, (False, True), search=(False,), short="fzp")
    # Each block's mean rounding error added back after the product (`block_bias`): asymmetric blocks only.
    block_bias: bool = knob(False, (False, True), short="bias")
    # The logits' product: the largest single weight of a small LM, and often the one quantization costs most
    # (docs/methodology.md, "Quality bounds for language models").
    lm_head: str = knob("same", ("same", "int8", "fp32"), search=("same",), short="head")
    # Modules whose products stay in int8 blocks, by the end of their torch module name (`up_proj`, `mlp.down_proj`),
    # read from the dynamo export's `pkg.torch.onnx.name_scopes` (`lm_modules.products_of`): what the sensitivity on
    # real text says costs the quality (docs/methodology.md, "Quality bounds for language models").
    int8_modules: tuple[str, ...] = knob((), None, search=((),), short="i8")
    exclude: tuple[str, ...] = knob((), None, search=((),), short="fp32", key="nodes_to_exclude")

    kind = Kind.QUANTIZATION
    inserts_ops = True

    @property
    def summary(self) -> str:
        head = "" if self.lm_head == "same" else f", lm_head in {self.lm_head}"
        return (f"int{self.bits} weight-only MatMul weights (MatMulNBits, {'symmetric ' if self.symmetric else ''}"
                f"blocks of {self.block_size}, {'int8' if self.accuracy_level == 4 else f'level {self.accuracy_level}'}"
                f" compute{head})")

    def __post_init__(self) -> None:
        self.check_knobs()
        if self.symmetric and self.float_zero_point:
            raise ValueError(f"{self.name}: float_zero_point=true needs symmetric=false (a symmetric block has no "
                             "zero point)")
        if self.block_bias and (self.symmetric or self.float_zero_point or self.bits != 4):
            raise ValueError(f"{self.name}: block_bias=true needs 4 bits, symmetric=false and float_zero_point=false "
                             "(it corrects the integer zero point's rounding)")

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return has_matmul_weights(model, context)

    def pre_processing(self, source: Path, context: Context) -> str:
        """How the source is prepared (`prepare.HOWS`): `quant_pre_process` without shape inference."""
        return "quant_pre_process"

    # MatMulNBits takes MatMul weights; plain Gemms are rewritten as MatMul + Add first (what `exclude` may name).
    weight_ops = ("MatMul", "Gemm")

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization.onnx_model import ONNXModel

        target = prepare_output(source, target_dir, self.name)
        source_bytes = model_bytes(source)
        with prepared(source, target.parent, context, how=self.pre_processing(source, context),
                      entry=self.name) as ready:
            model = onnx.load_model(str(ready.path), load_external_data=True)
        gemms = count_ops(model, ("Gemm",))["Gemm"]
        # The quantizer takes MatMul only, and torch exports most linear layers as Gemm: ORT's own rewrite
        # (the one quantize_dynamic uses) makes each plain Gemm a MatMul + Add, transposing a transB weight.
        untied = untie_fused_products(model)
        wrapped = ONNXModel(model)
        wrapped.replace_gemm_with_matmul()
        rewritten = gemms - count_ops(wrapped.model, ("Gemm",))["Gemm"]
        int8_nodes = products_of(onnx.load_model(str(source), load_external_data=False), self.int8_modules)
        if self.int8_modules and not int8_nodes:
            raise EntryError(self.name, f"finds no product of the modules {', '.join(self.int8_modules)} in the graph "
                             "(their names come from a dynamo export's name scopes)")
        # The rewrite names each Gemm's MatMul `<gemm>_MatMul`: what `exclude` and the module lookup name (nodes of the
        # pre-processed graph, where the Gemms still are) is found under that name.
        present = {node.name for node in wrapped.model.graph.node}
        exclude = _renamed(self.exclude, present)
        int8_nodes = _renamed(int8_nodes, present)
        quantized_model, corrections = self._quantize(wrapped.model, int8_nodes, exclude)
        folded = fold_flattening_reshapes(quantized_model)
        corrected = add_corrections(quantized_model, corrections, self.block_size)
        save_proto(quantized_model, target)

        nbits = [node for node in quantized_model.graph.node if node.op_type == "MatMulNBits"]
        k_of = [next(a.i for a in node.attribute if a.name == "K") for node in nbits]
        left = len(float_weights(quantized_model, ("MatMul", "Gemm")))
        target_bytes = model_bytes(target)
        notes = [
            "pre-processed with ORT's basic graph optimizations (quant_pre_process: constant folding makes "
            "weights behind a Transpose, such as a tied lm_head, initializers the quantizer takes)",
            f"{rewritten} of {gemms} Gemm rewritten as MatMul + Add so their weights can be quantized",
            f"{len(nbits)} MatMul weights quantized to int{self.bits} ({self._zero_point_text}, "
            f"block_size {self.block_size}, accuracy_level {self.accuracy_level}); {left} MatMul/Gemm float weights "
            "left",
            f"model size {source_bytes / 1e6:.2f} MB -> {target_bytes / 1e6:.2f} MB "
            f"({source_bytes / max(target_bytes, 1):.2f}x smaller)",
        ]
        if folded:
            notes.append(f"{folded} MatMulNBits read their input unflattened: the Reshapes around them (and what "
                         "computed their shapes) dropped")
        if untied:
            notes.append(f"{untied} FusedMatMul with a transposed weight (a tied lm_head, fused) rewritten as MatMul on "
                         "an untied copy of the weight, so it is quantized too")
        if corrected:
            notes.append(f"{corrected} int4 products with each block's mean rounding error added back (x @ S) @ C, "
                         "S summing each block's inputs")
        if self.exclude:
            notes.append(f"{len(self.exclude)} node(s) kept in fp32: {', '.join(self.exclude)}")
        if int8_nodes:
            notes.append(f"{len(int8_nodes)} product(s) of {', '.join(self.int8_modules)} in int8 blocks")
        padded = sum(1 for k in k_of if k % self.block_size)
        if padded:
            notes.append(f"{padded} of them have K not a multiple of {self.block_size}: their last block is "
                         "zero-padded")
        lm_head = lm_head_params(quantized_model)
        if lm_head:
            notes.append(f"lm_head (the product that makes the logits) runs in {lm_head['quantization.lm_head']}")
        if not nbits:
            notes.append("nothing was quantized: the model runs as float, with ORT's basic optimizations")
        return Candidate(
            path=target,
            applied=bool(nbits),
            fusions={"MatMulNBits": len(nbits)},
            fully_optimized=None,
            precision=f"int{self.bits}",
            notes=tuple(notes),
            params={
                "quantization.method": "weight_only",
                "quantization.bits": str(self.bits),
                "quantization.quantized_matmuls": str(len(nbits)),
                **lm_head,
            },
        )


    @property
    def _zero_point_text(self) -> str:
        if self.symmetric:
            return "symmetric"
        if self.float_zero_point:
            return "asymmetric, a float zero point per block"
        return "asymmetric, each block's mean error corrected" if self.block_bias else "asymmetric"

    def _quantize(self, model: onnx.ModelProto, int8_nodes: list[str],
                  exclude_nodes: list[str]) -> tuple[onnx.ModelProto, dict]:
        """The MatMul weights of `model` in blocks: ORT's quantizer, float zero points (`float_zero_points`) or
        integer ones with the blocks' mean errors (`block_bias`, returned by node for `add_corrections`); the lm_head
        as `lm_head` says, `int8_nodes` in int8 blocks and `exclude_nodes` left in fp32."""
        corrections = {}
        node = lm_head_node(model)
        head = node.name if node is not None and node.name else None  # the quantizers take nodes by name
        exclude = list(exclude_nodes) + int8_nodes
        if self.lm_head != "same" and head is not None:
            exclude.append(head)
        if self.float_zero_point:
            quantize_matmuls(model, block_size=self.block_size, accuracy_level=self.accuracy_level,
                             exclude=tuple(exclude))
        elif self.block_bias:
            corrections = quantize_matmuls_corrected(model, block_size=self.block_size,
                                                     accuracy_level=self.accuracy_level, exclude=tuple(exclude))
        else:
            model = _nbits(model, bits=self.bits, block_size=self.block_size, symmetric=self.symmetric,
                           accuracy_level=self.accuracy_level, exclude=exclude)
        eights = int8_nodes + ([head] if self.lm_head == "int8" and head is not None else [])
        if eights:
            model = _nbits(model, bits=8, block_size=self.block_size, symmetric=self.symmetric,
                           accuracy_level=self.accuracy_level, include=eights)
        return model, corrections


def _renamed(names: tuple[str, ...] | list[str], present: set[str]) -> list[str]:
    """Each of `names` as the graph in which `present` are the node names calls it: a Gemm rewritten as MatMul + Add
    is `<name>_MatMul` there (`ONNXModel.replace_gemm_with_matmul`)."""
    return [name if name in present or f"{name}_MatMul" not in present else f"{name}_MatMul" for name in names]


def _nbits(model: onnx.ModelProto, *, bits: int, block_size: int, symmetric: bool, accuracy_level: int,
           exclude: list[str] | None = None, include: list[str] | None = None) -> onnx.ModelProto:
    """ORT's `MatMulNBitsQuantizer` on `model`: the MatMul weights of the nodes in `include` (default: all but
    `exclude`) in blocks of `bits` integers."""
    with _quiet_quantizer():
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric,
                                         accuracy_level=accuracy_level, nodes_to_exclude=exclude or [],
                                         nodes_to_include=include)
        quantizer.process()
    return quantizer.model.model


BLOCK32 = Int4()
BLOCK128 = Int4(name="int4_block128", block_size=128)
# Weight-only int8 in blocks (MatMulNBits, 8 bits): near-lossless weights, the kernel as fast as int4's at level 4.
INT8_BLOCK32 = Int4(name="int8_block32", bits=8)
