"""The Python API training code calls: a `Study` of attempts (`tracker.study`), or one `log_attempt`
(`tracker.pipeline`)."""

from tracker.generation import GenerationScenario
from tracker.pipeline import AttemptSetup, StudySetup, log_attempt, log_measured, measure_record
from tracker.study import Study

__all__ = ["AttemptSetup", "GenerationScenario", "Study", "StudySetup", "log_attempt", "log_measured", "measure_record"]
