"""ONNX Runtime session options other than the graph level: the same model file, other threading.

`ort_threads_1` runs every kernel on one thread: against the study's threads it shows what intra-op
parallelism buys on this model (little for a µs-scale model, whose runs are dominated by overhead), and its
latency is what one core of a loaded server gives. `ort_parallel` runs independent branches of the graph at
once (ORT_PARALLEL, two inter-op threads): it pays off on graphs with parallel branches and costs
scheduling elsewhere.

`io_binding` changes how a decode-ready model is fed, not the session: its KV cache stays in buffers allocated once
and bound to the session (ORT's IO binding), with no numpy copy of the past and present per token. It matters to the
generation scenario; the forward pass runs the source as it is (an A/A comparison there). It goes last in a chain
(`int4_block32+io_binding`).
"""

from __future__ import annotations

from tracker.optimize.entry import session_entry

THREADS_1 = session_entry("ort_threads_1", "ORT with one intra-op thread (intra_op_num_threads=1)",
                          "one intra-op thread (intra_op_num_threads=1)", intra_op_num_threads=1)
PARALLEL = session_entry("ort_parallel", "ORT's parallel executor (ORT_PARALLEL, two inter-op threads)",
                         "independent branches at once (execution_mode=parallel, inter_op_num_threads=2)",
                         execution_mode="parallel", inter_op_num_threads=2)
IO_BINDING = session_entry("io_binding", "decode through ORT's IO binding, the KV cache in buffers allocated once",
                           "the decode loop binds its KV cache to buffers allocated once (IO binding, no numpy round "
                           "trip); the forward pass is the source's", decode_io_binding=True)
