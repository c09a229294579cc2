"""The closed sets of words a run holds, each one `StrEnum`: a member is its own tag or column value, so it
compares equal to the string MLflow stores and reads back (`Verdict.BETTER == "better"`)."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """An attempt's verdict against its runtime's baseline (`tracker.verdict`), decided by
    `tracker.measure.timing.speedup.judge` and by nothing else."""

    BASELINE = "baseline"  # the runtime's reference itself
    BETTER = "better"  # accuracy passed, faster by at least what the measurement could detect
    WORSE = "worse"  # accuracy passed, slower by at least what the measurement could detect
    SAME = "same"  # accuracy passed, the whole interval within +-5 %
    INCONCLUSIVE = "inconclusive"  # accuracy passed, no change found, the interval too wide to rule one out
    REJECTED = "rejected"  # the accuracy check failed

    @property
    def measured(self) -> bool:
        """Whether the verdict comes from the speed-up's interval (not the baseline, not a failed check)."""
        return self not in (Verdict.BASELINE, Verdict.REJECTED)


class Status(StrEnum):
    """How an attempt ended (`tracker.status`, a row's status)."""

    OK = "ok"
    DIFF_FAILED = "diff_failed"  # it ran, but its outputs are outside the tolerance
    FAILED = "failed"  # it crashed


class RunStatus(StrEnum):
    """The MLflow status a record's run ends with (the outbox keeps it until the upload)."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"


class Phase(StrEnum):
    """A scenario an attempt is measured in: one forward pass over the study's feeds, or a phase of generation
    with a KV cache (the prompt pass, one token against a past)."""

    FORWARD = "forward"
    PREFILL = "prefill"
    DECODE = "decode"


GENERATION_PHASES = (Phase.PREFILL, Phase.DECODE)


class Kind(StrEnum):
    """What a registry entry changes."""

    SESSION = "session"  # ONNX Runtime's session settings only
    TRANSFORM = "transform"  # a tool's graph transform (ORT's optimizer, onnxscript, fp16)
    FUSION = "fusion"  # a hand-written operator fusion
    QUANTIZATION = "quantization"  # int8, int4
