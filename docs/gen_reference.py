"""Writes the reference pages from the code at build time (mkdocs-gen-files runs it): the `tracker` command
from its argparse parser, the registry from `tracker.optimize.REGISTRY`, and what a run holds.

Each page is one function from code to Markdown, so a page cannot drift from what it describes:
`mkdocs build --strict` runs in the test suite (tests/test_docs.py). `run_contents()` is the one place that
says where the run contents come from; point it at the run schema once there is one.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import textwrap
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED_RUN_NAMES = ROOT / "tests" / "fixtures" / "linreg_run_names.json"
KINDS = ("params", "metrics", "tags", "artifacts")
KEYS_MODULES = ("tracker.base.keys",)  # where the TAG_* names live


# ----- the command line ---------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The `tracker` command's parser, from the function in `tracker.cli` that builds it."""
    from tracker import cli

    for name in ("build_parser", "parser", "_parser"):
        make = getattr(cli, name, None)
        if callable(make):
            return make()
    raise RuntimeError("tracker.cli has no function that builds its argparse parser (build_parser or _parser)")


def cli_page(parser: argparse.ArgumentParser) -> str:
    """One section per subcommand: its usage, what it does, and a table of its arguments."""
    lines = ["# Command line", "",
             "Generated from `tracker.cli`'s argparse parser when the site is built. `python -m tracker` is the "
             "same command.", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        lines += [f"## `tracker {name}`", ""]
        about = command.description or helps.get(name) or ""
        if about:
            lines += [_escape(about), ""]
        usage = " ".join(command.format_usage().removeprefix("usage: ").split())
        lines += ["```text", textwrap.fill(usage, width=110, subsequent_indent="    ", break_long_words=False,
                                           break_on_hyphens=False), "```", ""]
        lines += ["| argument | default | help |", "|---|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            lines.append(f"| {_argument(action)} | {_default(action)} | {_cell(_help(action))} |")
        lines += ["", *_deprecated(command)]
    return "\n".join(lines)


def _deprecated(command: argparse.ArgumentParser) -> list[str]:
    """The command's old spellings (hidden from its help), each with the one that replaces it."""
    from tracker.experiment_args import DeprecatedAlias

    old = [a for a in command._actions if isinstance(a, DeprecatedAlias)]
    if not old:
        return []
    spelled = ", ".join(f"`{o}` (use `{a.renamed.option_strings[0]}`)" for a in old for o in a.option_strings)
    return [f"Deprecated, and gone in the next release: {spelled}.", ""]


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        spelled = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs != 0:
            spelled += " " + _code(action.metavar or action.dest.upper())
    else:
        spelled = _code(action.metavar or action.dest)
    if action.choices:
        spelled += "<br>one of " + ", ".join(f"`{c}`" for c in action.choices)
    if action.required and action.option_strings:
        spelled += " (required)"
    return spelled


def _code(text: str) -> str:
    """Inline code a table cell can hold: a `|` (true|false) would split the cell, even inside backticks."""
    return f"<code>{_escape(text).replace('|', '&#124;')}</code>" if "|" in text else f"`{text}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    try:
        return text % {**vars(action), "prog": "tracker"}
    except (KeyError, TypeError, ValueError):
        return text


# ----- the registry -------------------------------------------------------------------------------------------

def registry_page() -> str:
    """One row per entry of `tracker.optimize.REGISTRY`, then the knobs of the entries that have them."""
    from tracker.optimize import REGISTRY

    lines = ["# Registry of attempts", "",
             "Generated from `tracker.optimize.REGISTRY` when the site is built. Each entry is one attempt: "
             "`tracker optimize` runs every entry that applies to a model, `study.optimize(name, model)` runs one. "
             "Spell a variant as `ENTRY:KNOB=VALUE` and a chain as `A+B` "
             "(see [the search](../search.md)).", "",
             "| entry | kind | what it does | applies to | runtimes |", "|---|---|---|---|---|"]
    for name, entry in REGISTRY.items():
        lines.append(f"| `{name}` | {entry.kind} | {_cell(entry.summary)} | {_cell(applies_to(entry))} | "
                     f"{', '.join(entry.runtimes)} |")
    lines += ["", "## Knobs", "",
              "An entry's knobs are fields of its frozen dataclass; a variant logs them as `quantization.*` params. "
              "Values in bold are the ones `--search` tries.", ""]
    for name, entry in REGISTRY.items():
        knobs = entry.knobs()
        if not knobs:
            continue
        lines += [f"### `{name}`", "", "| knob | default | values | param |", "|---|---|---|---|"]
        space = entry.space()
        for knob_name, knob in knobs.items():
            default = getattr(entry, knob_name)
            if knob.choices is None:
                values = "node names (left in fp32)"
            else:
                values = ", ".join(f"**{_value(c)}**" if c in space[knob_name] else _value(c) for c in knob.choices)
            param = f"`{entry.params_prefix}.{knob.key or knob_name}`"
            lines.append(f"| `{knob_name}` | `{_value(default)}` | {values} | {param} |")
        lines.append("")
    return "\n".join(lines)


def applies_to(entry) -> str:
    """What an entry applies to, in words: the docstring of the check it runs (its `applies` function, or the
    function its `requires` method returns)."""
    check = getattr(entry, "applies", None)
    if check is None:
        check = _check_called_by(type(entry).requires)
    text = _first_paragraph(check)
    if not text:
        return "see the entry's `requires`"
    # A check that builds on another says so by name first ("`transformer`, and a model type ..."): spell it out.
    named = re.match(r"^`(\w+)`", text)
    inner = check.__globals__.get(named.group(1)) if named and hasattr(check, "__globals__") else None
    if inner is not None and _first_paragraph(inner):
        text = _first_paragraph(inner).rstrip(".") + text[named.end():]
    return text


def _first_paragraph(function) -> str:
    doc = inspect.getdoc(function) if function is not None else None
    return doc.split("\n\n")[0].replace("\n", " ") if doc else ""


def _check_called_by(method):
    """The module-level function `method` returns the result of (`return has_matmul_weights(model, context)`)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            return method.__globals__.get(node.value.func.id)
    return None


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


# ----- what a run holds ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunKey:
    """One name a run holds: a param, metric, tag or artifact, and the runs that hold it."""

    kind: str  # one of KINDS
    name: str
    runs: tuple[str, ...]  # "study", "attempt"


def run_contents() -> list[RunKey]:
    """Every param, metric, tag and artifact a run holds, and which runs hold it.

    The source today: the pinned names of the linreg study's runs (`tests/fixtures/linreg_run_names.json`,
    kept true by tests/e2e/test_run_names.py), the study run and its attempt runs. Point this function at the run
    schema once there is one; the page and its test read only what it returns.
    """
    pinned = json.loads(PINNED_RUN_NAMES.read_text())
    study_runs = {run for run, names in pinned.items() if "tracker.best_attempt" in names.get("tags", [])}
    found: dict[tuple[str, str], set[str]] = {}
    for run, names in pinned.items():
        role = "study" if run in study_runs else "attempt"
        for kind in KINDS:
            for name in names.get(kind, []):
                found.setdefault((kind, name), set()).add(role)
    return [RunKey(kind, name, tuple(sorted(roles, reverse=True))) for (kind, name), roles in sorted(found.items())]


# What each name means, by pattern; the first that matches wins. Prose, not code: the names themselves come
# from `run_contents()`.
MEANINGS = (
    ("attempt.*", "the attempt's name and runtime"),
    ("diff.atol", "the accuracy check's absolute bound at the attempt's precision"),
    ("diff.rtol", "the accuracy check's relative bound at the attempt's precision"),
    ("diff.tolerance", "the precision whose bounds judge the outputs (fp32, fp16, int8, int4)"),
    ("diff.passed", "1 when the outputs pass the task's check against the baseline, else 0"),
    ("diff.nonfinite_mismatches", "output values NaN or infinite on one side only"),
    ("diff.*", "prediction difference against the baseline on the same feeds"),
    ("env.huge_pages", "whether the weights sat on huge pages: malloc, always or off"),
    ("env.*", "the machine and library versions it ran on"),
    ("measure.disturbed", "1 when other processes took more than 15 % of the CPU during a step"),
    ("measure.*", "how it was measured (the `MeasureConfig`)"),
    ("machine.bandwidth", "how the memory bandwidth was measured (its kernels)"),
    ("machine.gemm", "how the peak was measured (the GEMM)"),
    ("machine.threads", "the threads the roofs were measured with"),
    ("machine.seconds", "time spent measuring the roofs"),
    ("machine.*", "the machine's measured roofs: peak GFLOP/s (a 1024³ fp32 MatMul) and memory bandwidth"),
    ("model.size_bytes", "the model's size on disk, external data included"),
    ("model.*", "the model's opsets and IR version (params); on the study run, the model studied"),
    ("ort.*", "the ONNX Runtime session settings the attempt ran under"),
    ("graph.*", "graph statistics, and the difference in nodes with the baseline"),
    ("latency.first_run_ms", "the cold first run"),
    ("latency.speedup_vs_baseline", "the plain ratio of the baseline's p50 to the attempt's"),
    ("latency.speedup_mde", "the smallest change the speed-up measurement would detect"),
    ("latency.speedup_ci_*", "the speed-up's 95 % interval"),
    ("latency.speedup", "speed-up against the runtime's baseline, timed in turn with it"),
    ("latency.speedup_*", "how the speed-up was timed: rounds, pairs, calls per block"),
    ("latency.*", "latency with profiling off, under the attempt's own session settings"),
    ("memory.session_mb", "resident memory the session adds, its first run included"),
    ("session.create_ms", "time to create the ONNX Runtime session"),
    ("op.*", "per op type: total time, calls, share of time, time per run (here the op type is LinearRegressor)"),
    ("profile.overhead_ratio", "profiled mean over unprofiled mean"),
    ("profile.*", "the profiled session: runs and kernel events"),
    ("quality.*", "the linreg study's own task metrics (`Study(evaluate=...)`)"),
    ("roofline.memory_bound", "1 when most kernel time is in op types below the ridge"),
    ("roofline.*", "where the ops stand against the machine's roofs (FLOPs, bytes, share of the peak)"),
    ("study.*", "the study's attempt counts"),
    ("time.tracker_share", "the tracker's own share of the study's wall time"),
    ("time.*", "seconds per step of the study"),
    ("mlflow.*", "set by MLflow"),
    ("data", "the study's data set"),
    ("model", "the model the study studies"),
    ("mlflow.note.content", "the attempt's notes: what its entry did, what it skipped or repaired"),
    ("tracker.study", "the study's name"),
    ("tracker.attempt", "the attempt's name"),
    ("tracker.runtime", "the runtime the attempt ran in (onnxruntime or reference)"),
    ("tracker.role", "study (the parent run) or attempt (a nested run); a search's light runs: candidate"),

    ("tracker.diff", "the accuracy check's result in words"),
    ("tracker.error", "why a crashed attempt failed (the traceback is in error.txt)"),
    ("tracker.best_attempt", "the best attempt of the study (forward scenario)"),
    ("split.random_state", "the train/test split's seed"),
    ("charts/*", "offline plotly charts: time, calls and share per op; roofline; attempt against baseline"),
    ("graph.json", "graph statistics"),
    ("profile/ort_profile.json", "the raw ONNX Runtime profile (gzip above 16 MB)"),
    ("profile/ort_optimized_model.onnx", "ONNX Runtime's runtime-optimized graph, without its weights"),
    ("tables/op_diff.*", "per-op difference with the baseline"),
    ("tables/graph_diff.*", "graph difference with the baseline"),
    ("tables/roofline.*", "per op type FLOPs, bytes and share of the roofs"),
    ("tables/ops_by_*", "per-op aggregates by op type, node, provider or layer (`.json`: an MLflow table)"),
    ("report/study_report.html", "the study's offline report page"),
    ("report/*", "the study's tables as MLflow tables"),
)


def meaning(name: str) -> str:
    """What `name` holds: the words of its enum (`tracker.base.vocabulary`), else the first of MEANINGS that matches
    it, else the comment beside its tag constant."""
    from tracker.base.vocabulary import Status, Verdict

    words = {"tracker.status": Status, "tracker.verdict": Verdict}
    if name in words:
        return "one of " + ", ".join(f"`{member}`" for member in words[name])
    found = next((text for pattern, text in MEANINGS if fnmatch(name, pattern)), "")
    return found or next((comment for _, tag, comment in tracker_tags() if tag == name), "")


def run_contents_page(keys: list[RunKey]) -> str:
    """Tables of every name `keys` holds, by kind, then the tags the tracker sets (from `tracker.base.keys`)."""
    lines = ["# What a run holds", "",
             "Generated when the site is built from the names the linreg study's runs hold, pinned in "
             "`tests/fixtures/linreg_run_names.json` (a test keeps them true), and from the tracker's keys module. "
             "Other studies add their own names (`fusion.*`, `gen.*`, `latency.s<N>.*`, `diff.cosine_*`...): "
             "[concepts](../concepts.md#what-a-run-holds) lists them. The study run is the parent; each "
             "attempt is a run nested under it.", ""]
    for kind in KINDS:
        lines += [f"## {kind.capitalize()}", "", "| name | runs | what |", "|---|---|---|"]
        lines += [f"| `{k.name}` | {', '.join(k.runs)} | {_cell(meaning(k.name))} |" for k in keys if k.kind == kind]
        lines.append("")
    lines += ["## Tags the tracker sets", "",
              "Every `tracker.*` tag name in the tracker's keys module, with its comment there; some are set only on "
              "some runs (a chain, a search, a disturbed measurement, an upload).", "",
              "| constant | tag | when |", "|---|---|---|"]
    lines += [f"| `{constant}` | `{tag}` | {_cell(comment or meaning(tag))} |" for constant, tag, comment in tracker_tags()]
    lines.append("")
    return "\n".join(lines + scenario_keys())


def scenario_keys() -> list[str]:
    """Where each scenario's figures live among a run's metrics, from the schema (`tracker.measure.schema.Scope`)."""
    from tracker.base.vocabulary import Phase
    from tracker.measure.schema import Scope, speedup_metrics
    from tracker.measure.timing.speedup import BASELINE_SPEEDUP

    lines = ["## Scenarios", "",
             "Each scenario's figures, from the schema (`tracker.measure.schema`): the same names are written by the "
             "measurement and read back into the report's rows. A generation phase's length is part of its names "
             "(here 128 and 512).", "", "| scenario | median latency | speed-up | check | matrix products' roof |",
             "|---|---|---|---|---|"]
    for scope in (Scope(Phase.FORWARD), Scope(Phase.PREFILL, 128), Scope(Phase.DECODE, 512)):
        speedup = " ".join(f"`{key}`" for key in speedup_metrics(BASELINE_SPEEDUP, scope))
        roofline = scope.roofline_prefix + "roofline."
        lines.append(f"| {scope.phase} | `{scope.prefix}p50_ms` | {speedup} | `{scope.check_key}` | "
                     f"`{roofline}matmuls.pct_peak` `{roofline}memory_bound` |")
    return lines + [""] + generation_keys()


def generation_keys() -> list[str]:
    """The decode step's split and the tokens per second of each phase's interleaved timing, from the code that
    writes them (`StepSplit.metrics`, `PhaseTiming.metrics`)."""
    from tracker.base.vocabulary import Phase
    from tracker.measure.costmodel.step_split import SPLIT, Part
    from tracker.measure.generation.phase_timing import PhaseTiming
    from tracker.measure.schema import Scope
    from tracker.measure.timing.speedup import BASELINE_SPEEDUP

    decode = Scope(Phase.DECODE, 512).prefix
    split = " ".join(f"`{decode}{SPLIT}{part}_ms`" for part in Part)
    timing = " ".join(f"`{key}`" for key in PhaseTiming(BASELINE_SPEEDUP, 1.0, 1.0, 1.0, 1.0).metrics(decode))
    return ["Where a decode step's time goes (each part also as `..._share` of `" + decode + SPLIT + "step_ms`): "
            + split + ".", "",
            "The tokens per second a user quotes, from the same interleaved timing as the speed-up (prefill and "
            "decode alike): " + timing + ".", ""]


def tracker_tags() -> list[tuple[str, str, str]]:
    """`(constant, tag, comment)` for each `TAG_*` string constant of the tracker's keys module."""
    source = inspect.getsource(_keys_module()).splitlines()
    found = []
    for index, line in enumerate(source):
        match = re.match(r'^(TAG_\w+) = "([^"]+)"\s*(?:#\s*(.*))?$', line)
        if match:
            comment = match.group(3) or ""
            if not comment and index and source[index - 1].startswith("#"):
                comment = source[index - 1].lstrip("# ")
            found.append((match.group(1), match.group(2), comment))
    return found


def _keys_module():
    """The module that names the tracker's tags (`tracker.base.keys`)."""
    import importlib

    for name in KEYS_MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise RuntimeError(f"none of {', '.join(KEYS_MODULES)} exists: point KEYS_MODULES at the module of TAG_* names")


# ----- helpers and the build ----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return _escape(" ".join(str(text).split())).replace("|", "\\|")


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def write_pages() -> None:
    import mkdocs_gen_files

    pages = {"reference/cli.md": cli_page(build_parser()),
             "reference/registry.md": registry_page(),
             "reference/run-contents.md": run_contents_page(run_contents())}
    for path, text in pages.items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text)


if __name__ in ("__main__", "<run_path>"):  # mkdocs-gen-files runs the script as `<run_path>`
    write_pages()
