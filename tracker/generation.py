"""The generation scenario of a study: each attempt is also measured generating with a KV cache.

A study given a `GenerationScenario` (`StudySetup.generation`) measures it inside the attempt pipeline: its first
attempt (the baseline) generates with the decode-ready export as it is, and each registry entry the study runs
(`Study.optimize`) is applied to that export too, so its prefill and decode are timed against the baseline's and its
tokens checked along the baseline's. The figures land on the attempt's own run (`gen.*`, through
`tracker.measure.schema`), and the phases' rooflines on its result for the study report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from tracker.base.termination import reraise_if_received
from tracker.measure.accuracy.text_quality import TextQuality
from tracker.measure.costmodel.machine import MachinePeaks, memory_gbps
from tracker.measure.costmodel.roofline import Roofline
from tracker.measure.generation.generation import GenerationResult, measure_generation
from tracker.measure.generation.generation_check import compare_generations
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.optimize import Context, Entry, EntryError
from tracker.search.decode import DecodeSetup, DecodeTarget

logger = logging.getLogger(__name__)

# The memory bandwidth measured just before each attempt's generation: a memory-bound decode's ratio to the baseline
# moves with it on a shared machine (docs/results.md, "Past 4x"), so a reader can tell when the machine changed.
BANDWIDTH = "gen.machine_bandwidth_gbps"
# Which decode figure to quote, said on every run of the scenario (docs/methodology.md, "Which decode figure is true").
QUOTE = ("quote gen.decode.past<N>.tokens_per_s [ci_low, ci_high] and its speedup: timed interleaved with the baseline "
         "(A/A 1.01-1.03, a graph computed twice 0.509-0.515 on gpt2-small at past 512); gen.decode.past<N>.p50_ms is "
         "timed alone, minutes from the baseline's, and gen.decode_tokens_per_s is the greedy loop at shorter pasts")


@dataclass(frozen=True)
class GenerationFigures:
    """What the generation scenario adds to one attempt's run: `gen.*` metrics and params, and the rooflines of its
    phases (by phase), for the study report."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    rooflines: Mapping[str, Roofline] = field(default_factory=dict)


@dataclass
class GenerationScenario:
    """Generation with a KV cache on a decode-ready export (`setup.decoder`), measured for every attempt of a study.

    Attributes:
        setup: the decode-ready export, what is timed, its ONNX Runtime settings, the check's tolerances and real text
            (`tracker.search.decode.DecodeSetup`, which a decode search measures with too).
        speedup: how each phase is timed against the baseline's.
        max_positions: the longest sequence the model holds.
    """

    setup: DecodeSetup
    speedup: SpeedupConfig
    max_positions: int
    baseline: GenerationResult | None = field(default=None, init=False)

    def measure_baseline(self, *, machine: MachinePeaks | None, workdir: Path) -> GenerationFigures:
        """The baseline's generation, and its check against itself (every figure of a perfect match), so that every
        attempt carries the same `gen.diff.*` keys."""
        logger.info("generation: measuring the baseline's")
        bandwidth = memory_gbps(threads=self.setup.session.intra_op_num_threads)
        result = measure_generation(self.setup.decoder, session=self.setup.session, config=self.setup.config,
                                    max_positions=self.max_positions, machine=machine, workdir=workdir)
        self.baseline = result
        own = result.generation
        quality = self._quality(self.setup.decoder, self.setup.session, "fp32", workdir, reference=True)
        diff = compare_generations(own, own, along=own.step_logits, quality=quality)
        return GenerationFigures({**result.metrics(), **diff.metrics(), BANDWIDTH: bandwidth},
                                 {"gen.io_binding": str(result.io_binding), "gen.quote": QUOTE, **diff.params()},
                                 dict(result.rooflines))

    def target(self) -> DecodeTarget:
        """What a decode search measures against (`tracker.search.decode`): this scenario's export, settings, and the
        baseline's generation and text check."""
        if self.baseline is None:
            raise RuntimeError("measure the baseline's generation (measure_baseline) before a decode search")
        return DecodeTarget(self.setup, self.baseline.generation)

    def _quality(self, model: Path, session: SessionConfig, precision: str, workdir: Path, *,
                 reference: bool = False) -> TextQuality | None:
        """The decode loop's quality on real text (`text`), or None without real text."""
        if self.setup.text is None:
            return None
        return self.setup.text.measure(model, session, precision=precision, workdir=workdir / "quality", reference=reference)

    def measure_entry(self, entry: Entry, *, machine: MachinePeaks | None, workdir: Path,
                      graph_of: Callable[[Path], onnx.ModelProto]) -> GenerationFigures:
        """`entry` applied to the decode-ready export, its generation measured and checked against the baseline's with
        the tolerance of its precision. An entry that does not apply, or fails, is data: the param `gen.error`."""
        if self.baseline is None:
            raise RuntimeError("measure the baseline's generation (measure_baseline) before an entry's")
        try:
            candidate = entry(self.setup.decoder, workdir, Context(info=self.setup.info), graph=graph_of(self.setup.decoder))
            logger.info("generation: measuring %s's", entry.name)
            bandwidth = memory_gbps(threads=self.setup.session.intra_op_num_threads)
            result = measure_generation(candidate.path, session=candidate.session_on(self.setup.session),
                                        config=self.setup.config, baseline=self.setup.decoder, baseline_session=self.setup.session,
                                        speedup=self.speedup,
                                        reference=self.baseline.generation, machine=machine,
                                        workdir=workdir / "profiles")
            quality = self._quality(candidate.path, candidate.session_on(self.setup.session), candidate.precision, workdir)
            diff = compare_generations(self.baseline.generation, result.generation, along=result.along_reference,
                                       tolerance=self.setup.tolerances[candidate.precision], quality=quality)
        except EntryError as e:  # it does not apply to the decode-ready model, or broke what the framework checks
            return GenerationFigures(params={"gen.error": f"on the decode-ready model: {e}"[:500]})
        except Exception as e:  # noqa: BLE001 -- a failure on the decode graph is a finding, logged on the attempt's run
            reraise_if_received(e)
            logger.warning("generation: %s failed: %s", entry.name, e)
            return GenerationFigures(params={"gen.error": f"{type(e).__name__}: {e}"[:500]})
        metrics = {**result.metrics(), **diff.metrics(), BANDWIDTH: bandwidth}
        metrics.update({f"gen.fusion.{op}": float(n) for op, n in candidate.fusions.items()})
        return GenerationFigures(metrics, {"gen.applied": str(candidate.applied), "gen.io_binding": str(result.io_binding),
                                           "gen.quote": QUOTE, **diff.params()},
                                 dict(result.rooflines))
