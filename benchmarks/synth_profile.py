"""Writes a synthetic GPT-2-small-like ONNX Runtime 1.32 profile, byte for byte in ORT's own layout.

Per run: the 533 kernels of GPT-2 small at sequence length 32 in ORT's CPU runtime graph (12 blocks x 44 + 5), each
with ORT 1.32's args (shapes, sizes, mem_* fields, thread_scheduling_stats), then the run's
SequentialExecutor::Execute and model_run events enclosing them. Seeded: the same arguments give the same file.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

_SEQ, _LAYERS, _PID, _TID_POOL = 32, 12, 2019, ("140127813510912", "140127805118208", "140127796725504")
_FLOAT, _INT, _BOOL = "float", "int64", "bool"
_ITEM_BYTES = {_FLOAT: 4, _INT: 8, _BOOL: 1}
_H = [1, _SEQ, 768]
_HD, _HT, _KT, _S = [1, _SEQ, 12, 64], [1, 12, _SEQ, 64], [1, 12, 64, _SEQ], [1, 12, _SEQ, _SEQ]
_I0, _I1 = (_INT, []), (_INT, [1])


def _conv1d(prefix: str, k: int, n: int, dur: int) -> list[tuple]:
    # HF GPT-2 Conv1D exports as Reshape -> Gemm -> Reshape; the Gemm carries the weight and bias.
    rows, cols = [_SEQ, k], [_SEQ, n]
    return [(f"{prefix}/Reshape", "Reshape", [(_FLOAT, [1, _SEQ, k]), (_INT, [2])], [(_FLOAT, rows)], 1, 2),
            (f"{prefix}/Gemm", "Gemm", [(_FLOAT, rows), (_FLOAT, [k, n]), (_FLOAT, [n])], [(_FLOAT, cols)], 2, dur),
            (f"{prefix}/Reshape_1", "Reshape", [(_FLOAT, cols), (_INT, [3])], [(_FLOAT, [1, _SEQ, n])], 1, 2)]


def _layer(p: str) -> list[tuple]:
    """The 44 kernels of one GPT-2 block in ORT's runtime graph: (name, op, inputs, outputs, n_params, dur_us)."""
    a, ln = f"{p}/attn", [(_FLOAT, _H), (_FLOAT, [768]), (_FLOAT, [768])]
    nodes = [(f"{p}/ln_1/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14)]
    nodes += _conv1d(f"{a}/c_attn", 768, 2304, 150)
    nodes += [(f"{a}/Split", "Split", [(_FLOAT, [1, _SEQ, 2304]), (_INT, [3])], [(_FLOAT, _H)] * 3, 1, 5),
              (f"{a}/Shape", "Shape", [(_FLOAT, _H)], [(_INT, [3])], 0, 1),
              (f"{a}/Gather", "Gather", [(_INT, [3]), _I0], [_I0], 1, 1),
              (f"{a}/Unsqueeze", "Unsqueeze", [_I0, _I1], [_I1], 1, 1),
              (f"{a}/Concat", "Concat", [_I1] * 4, [(_INT, [4])], 3, 2)]
    nodes += [(f"{a}/Reshape{s}", "Reshape", [(_FLOAT, _H), (_INT, [4])], [(_FLOAT, _HD)], 0, 2)
              for s in ("", "_1", "_2")]
    nodes += [(f"{a}/Transpose{s}", "Transpose", [(_FLOAT, _HD)], [(_FLOAT, o)], 0, 7)
              for s, o in (("", _HT), ("_1", _KT), ("_2", _HT))]
    nodes += [(f"{a}/FusedMatMul", "FusedMatMul", [(_FLOAT, _HT), (_FLOAT, _KT)], [(_FLOAT, _S)], 0, 16),
              (f"{a}/Shape_1", "Shape", [(_FLOAT, _HT)], [(_INT, [4])], 0, 1),
              (f"{a}/Gather_1", "Gather", [(_INT, [4]), _I0], [_I0], 1, 1),
              (f"{a}/Shape_2", "Shape", [(_FLOAT, _KT)], [(_INT, [4])], 0, 1),
              (f"{a}/Gather_2", "Gather", [(_INT, [4]), _I0], [_I0], 1, 1),
              (f"{a}/Sub", "Sub", [_I0, _I0], [_I0], 0, 1),
              (f"{a}/Unsqueeze_1", "Unsqueeze", [_I0, _I1], [_I1], 1, 1),
              (f"{a}/Slice", "Slice", [(_BOOL, [1, 1, 1024, 1024])] + [_I1] * 3, [(_BOOL, [1, 1, _SEQ, 1024])], 3, 3),
              (f"{a}/Slice_1", "Slice", [(_BOOL, [1, 1, _SEQ, 1024])] + [_I1] * 3, [(_BOOL, [1, 1, _SEQ, _SEQ])], 3, 2),
              (f"{a}/Cast", "Cast", [_I0], [(_FLOAT, [])], 0, 1),
              (f"{a}/Where", "Where", [(_BOOL, [1, 1, _SEQ, _SEQ]), (_FLOAT, _S), (_FLOAT, [])], [(_FLOAT, _S)], 1, 5),
              (f"{a}/Softmax", "Softmax", [(_FLOAT, _S)], [(_FLOAT, _S)], 0, 11),
              (f"{a}/MatMul", "MatMul", [(_FLOAT, _S), (_FLOAT, _HT)], [(_FLOAT, _HT)], 0, 13),
              (f"{a}/Transpose_3", "Transpose", [(_FLOAT, _HT)], [(_FLOAT, _HD)], 0, 7),
              (f"{a}/Concat_1", "Concat", [_I1] * 3, [(_INT, [3])], 2, 2),
              (f"{a}/Reshape_3", "Reshape", [(_FLOAT, _HD), (_INT, [3])], [(_FLOAT, _H)], 0, 2)]
    nodes += _conv1d(f"{a}/c_proj", 768, 768, 50)
    nodes += [(f"{p}/Add", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5),
              (f"{p}/ln_2/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14)]
    nodes += _conv1d(f"{p}/mlp/c_fc", 768, 3072, 190)
    nodes += [(f"{p}/mlp/act/FastGelu", "FastGelu", [(_FLOAT, [1, _SEQ, 3072])], [(_FLOAT, [1, _SEQ, 3072])], 0, 30)]
    nodes += _conv1d(f"{p}/mlp/c_proj", 3072, 768, 185)
    nodes += [(f"{p}/Add_1", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5)]
    assert len(nodes) == 44, len(nodes)
    return nodes


def gpt2_graph() -> list[tuple]:
    """The 533 kernels of one GPT-2 small run at sequence length 32, in execution order."""
    nodes = [("/transformer/wte/Gather", "Gather", [(_INT, [1, _SEQ]), (_FLOAT, [50257, 768])], [(_FLOAT, _H)], 1, 9),
             ("/transformer/wpe/Gather", "Gather", [(_INT, [1, _SEQ]), (_FLOAT, [1024, 768])], [(_FLOAT, _H)], 1, 4),
             ("/transformer/Add", "Add", [(_FLOAT, _H)] * 2, [(_FLOAT, _H)], 0, 5)]
    for i in range(_LAYERS):
        nodes += _layer(f"/transformer/h.{i}")
    ln = [(_FLOAT, _H), (_FLOAT, [768]), (_FLOAT, [768])]
    nodes += [("/transformer/ln_f/LayerNormalization", "LayerNormalization", ln, [(_FLOAT, _H)], 2, 14),
              ("/lm_head/MatMul", "MatMul", [(_FLOAT, _H), (_FLOAT, [768, 50257])], [(_FLOAT, [1, _SEQ, 50257])], 1,
               2100)]
    return nodes


def _nbytes(io: list) -> int:
    total = 0
    for dtype, shape in io:
        n = _ITEM_BYTES[dtype]
        for d in shape:
            n *= d
        total += n
    return total


def _shapes(io: list) -> str:
    return "[" + ",".join(f'{{"{t}":[{",".join(map(str, s))}]}}' for t, s in io) + "]"


def _event(cat: str, name: str, ts: int, dur: int, args: str = "") -> str:
    return (f'{{"cat" : "{cat}","pid" :{_PID},"tid" :{_PID},"dur" :{dur},"ts" :{ts},"ph" : "X",'
            f'"name" :"{name}","args" : {{{args}}}}}')


def _thread_stats(rng: random.Random, dur: int) -> str:
    # What ORT's ThreadPoolProfiler::Stop writes (raw JSON) when the session has an intra-op pool.
    busy = int(dur >= 10)
    blocks = ", ".join([str(rng.choice((4, 8, 16)))] * 4) if busy else ""
    subs = ",".join(f'"{t}": {{"num_run": {busy}, "core": {c}}}' for c, t in enumerate(_TID_POOL, 1))
    return ('{"main_thread": {"thread_pool_name": "session-1-intra-op", "thread_id": "140127830296384", '
            f'"block_size": [{blocks}], "core": 0, "Distribution": {rng.randint(1, 4) * busy}, '
            f'"DistributionEnqueue": {busy}, "Run": {dur // 2 * busy}, "Wait": {rng.randint(0, 3) * busy}, '
            f'"WaitRevoke": 0}}, "sub_threads": {{{subs}}}}}')


def synthesize_profile(path: Path, *, runs: int, seed: int = 0) -> int:
    """Writes a GPT-2-like ORT 1.32 profile of `runs` runs in ORT's own layout; returns its kernel event count.

    The file is written run by run, so its size is not bounded by memory; a name ending in .gz makes it gzip
    (level 1: a profile compresses ~10x at any level, and level 1 is several times faster).
    """
    with _open_text(Path(path)) as out:
        for text in _profile_text(runs, seed):
            out.write(text)
    return runs * len(gpt2_graph())


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "wt", encoding="utf-8", newline="\n", compresslevel=1)
    return path.open("w", encoding="utf-8", newline="\n")


def _profile_text(runs: int, seed: int) -> Iterator[str]:
    """The text of the profile, one piece per run."""
    rng = random.Random(seed)
    static = [(f"{name}_kernel_time", op, _shapes(ins), _shapes(outs), _nbytes(outs),
               _nbytes(ins[:len(ins) - n_params]), _nbytes(ins[len(ins) - n_params:]), dur)
              for name, op, ins, outs, n_params, dur in gpt2_graph()]
    yield "[\n" + _event("Session", "model_loading_uri", 3, 251_306) + ",\n"
    yield _event("Session", "session_initialization", 251_420, 903_877)
    t, in_use, peak, arena = 1_156_000, 0, 0, 0
    for run in range(runs):
        lines = []
        slow = 3.0 if run == 0 else 1.0  # the first run allocates and picks kernels
        exec_ts = t + rng.randint(5, 12)
        ts = exec_ts + rng.randint(3, 8)
        for index, (name, op, in_shapes, out_shapes, out_size, act_size, param_size, base) in enumerate(static):
            dur = max(1, round(base * slow * rng.uniform(0.8, 1.3)))
            delta = -(-out_size // 64) * 64 - (in_use // 2 if index % 3 == 0 else 0)
            in_use += delta
            peak = max(peak, in_use)
            arena_delta = max(0, -(-peak // 1_048_576) * 1_048_576 - arena)
            arena += arena_delta
            args = [("op_name", f'"{op}"'), ("provider", '"CPUExecutionProvider"'), ("node_index", f'"{index}"'),
                    ("input_type_shape", in_shapes), ("output_type_shape", out_shapes),
                    ("output_size", f'"{out_size}"'), ("activation_size", f'"{act_size}"'),
                    ("parameter_size", f'"{param_size}"'), ("thread_scheduling_stats", _thread_stats(rng, dur)),
                    ("mem_in_use_delta", f'"{delta}"'), ("mem_bytes_in_use", f'"{in_use}"'),
                    ("mem_in_use_peak", f'"{peak}"'), ("mem_arena_held", f'"{arena}"'),
                    ("mem_arena_held_delta", f'"{arena_delta}"'), ("mem_requested_in_use_delta", f'"{delta - 64}"'),
                    ("mem_bytes_requested_in_use", f'"{max(0, in_use - 192)}"')]
            rng.shuffle(args)  # ORT keeps args in an unordered_map: the key order varies per event
            lines.append(_event("Node", name, ts, dur, ",".join(f'"{k}" : {v}' for k, v in args)))
            ts += dur + rng.randint(1, 4)
        exec_end = ts + rng.randint(2, 6)
        lines.append(_event("Session", "SequentialExecutor::Execute", exec_ts, exec_end - exec_ts))
        lines.append(_event("Session", "model_run", t, exec_end + rng.randint(2, 6) - t))
        t = exec_end + rng.randint(60, 250)
        in_use = 0
        yield ",\n" + ",\n".join(lines)
    yield "\n]\n"
