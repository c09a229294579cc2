"""Probe cases of issue 22, items 10, 13 and 14: outputs `tracker optimize` must judge although they are not plain
finite tensors (NaN carried from the feeds, a default skl2onnx classifier's ZipMap maps, a sequence of tensors),
and a study with nothing to judge, which must exit non-zero.

Each case runs `python -m tracker optimize` from outside in an empty folder, on a sqlite store there, and returns
(held, one-line observation). Each takes 15-30 s, most of it the study's measurement of the machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from probe_common import Case, error_line, linear_model, run_cases, run_tracker, save

FAST = ["--profile-runs", "3", "--min-runs", "3", "--min-seconds", "0", "--speedup-rounds", "4",
        "--speedup-seconds", "0", "--threads", "1"]


def _optimize(tmp: Path, model: Path, *args: str) -> subprocess.CompletedProcess:
    return run_tracker(tmp, "optimize", str(model), *FAST, *args)


def _rows(done: subprocess.CompletedProcess) -> dict[str, str]:
    """The comparison's rows by attempt name (the table `tracker optimize` prints)."""
    rows = {}
    for line in done.stdout.splitlines()[2:]:
        words = line.lstrip("* ").split()
        if words and not line.startswith("note:"):
            rows[words[0]] = line
    return rows


def _linear(tmp: Path) -> Path:
    return save(linear_model(), tmp / "linear.onnx")


def nan_feeds(tmp: Path) -> tuple[bool, str]:
    """Real feeds holding NaN and inf: the baseline against itself and a same-graph attempt must pass."""
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    x[0, 1], x[2, 2] = np.nan, np.inf
    np.savez(tmp / "X.npz", X=x)
    done = _optimize(tmp, _linear(tmp), "--feeds", str(tmp / "X.npz"), "--attempts", "ort_opt_disabled")
    rows = _rows(done)
    baseline, other = rows.get("baseline", ""), rows.get("ort_opt_disabled", "")
    warned = "NaN or infinite values" in done.stderr
    held = (done.returncode == 0 and "passed" in baseline and "passed" in other and "rejected" not in other
            and warned)
    return held, (f"exit {done.returncode}; baseline {'passed' if 'passed' in baseline else 'FAILED'}, "
                  f"ort_opt_disabled {'rejected' if 'rejected' in other else 'not rejected'}; "
                  f"{'a warning names the NaN/inf in the feeds' if warned else 'no word of the NaN/inf in the feeds'}")


def _forest(tmp: Path) -> Path:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    model = to_onnx(RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(X, y), X[:1],
                    target_opset=18)  # default options: zipmap on
    np.savez(tmp / "X.npz", **{model.graph.input[0].name: X[::5]})
    return save(model, tmp / "rf.onnx")


def skl2onnx_forest(tmp: Path) -> tuple[bool, str]:
    """`tracker optimize rf.onnx --task classification --feeds X.npz` on a default skl2onnx RandomForest."""
    done = _optimize(tmp, _forest(tmp), "--task", "classification", "--feeds", str(tmp / "X.npz"), "--attempts",
                     "ort_opt_disabled")
    rows = _rows(done)
    judged = [name for name, row in rows.items() if "top1 100.0%" in row and "failed" not in row]
    held = done.returncode == 0 and judged == ["baseline", "ort_opt_disabled"]
    return held, (f"exit {done.returncode}; judged by label and class probability: {', '.join(judged) or 'none'}"
                  f"{'; ' + error_line(done) if error_line(done) else ''}")


def sequence_output(tmp: Path) -> tuple[bool, str]:
    """A model whose output is a sequence of tensors of different shapes (SequenceConstruct of X [2, 3] and its
    transpose): measured and diffed element-wise."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    seq = helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Transpose", ["X"], ["T"]), helper.make_node("SequenceConstruct", ["X", "T"], ["S"])]
    graph = helper.make_graph(nodes, "sequence", [x], [seq])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp / "seq.onnx")
    done = _optimize(tmp, model, "--dim", "N=2", "--attempts", "ort_opt_disabled")
    rows = _rows(done)
    judged = [name for name, row in rows.items() if "passed" in row and "failed" not in row]
    held = done.returncode == 0 and judged == ["baseline", "ort_opt_disabled"]
    return held, (f"exit {done.returncode}; attempts measured and passed: {', '.join(judged) or 'none'}"
                  f"{'; ' + error_line(done) if error_line(done) else ''}")


def failed_baseline(tmp: Path) -> tuple[bool, str]:
    """A model that fails on every run (a Reshape to a size it cannot have): exit non-zero, saying why."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 5])
    shape = numpy_helper.from_array(np.array([3, 5], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["X", "shape"], ["Y"])], "reshape", [x], [y], [shape])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp / "broken.onnx")
    done = _optimize(tmp, model, "--dim", "N=2", "--attempts", "ort_opt_disabled,ort_threads_1")
    error = error_line(done)
    held = (done.returncode not in (0, 2) and "Traceback" not in done.stderr
            and error.startswith("error: the baseline attempt failed"))
    return held, f"exit {done.returncode}; {error or 'no error line'}"


CASES: list[Case] = [
    ("10", "NaN/inf in real feeds: baseline and a same-graph attempt pass", nan_feeds),
    ("13", "default skl2onnx RandomForest (ZipMap) with --task classification", skl2onnx_forest),
    ("13", "a sequence-of-tensors output", sequence_output),
    ("14", "every run of the baseline fails: exit non-zero with the reason", failed_baseline),
]


if __name__ == "__main__":
    sys.exit(run_cases(CASES))
