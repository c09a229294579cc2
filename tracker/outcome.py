"""What asking for one attempt gave back (`Study.optimize`, an `Executor`'s `submit`): measured here, failed with a
reason, or pending on a cluster's node. A search strategy takes one back for each candidate it proposed."""

from __future__ import annotations

from dataclasses import dataclass

from tracker.measure.attempt import AttemptResult


@dataclass(frozen=True)
class Measured:
    """Measured and logged (or kept in the outbox): the figures are in `result`."""

    result: AttemptResult

    @property
    def name(self) -> str:
        return self.result.attempt.name


@dataclass(frozen=True)
class Failed:
    """Not measured: the entry did not apply, its optimizer raised, or the measurement failed (`result` then holds
    what was measured before it did). Either way the failure is logged as the attempt's own run."""

    name: str
    reason: str
    result: AttemptResult | None = None


@dataclass(frozen=True)
class Pending:
    """Sent to a cluster's nodes: the driver logs its runs as they come back (`ticket` asks for them)."""

    name: str
    ticket: int

    @property
    def result(self) -> None:  # not here yet: the study's `wait` (or its end) collects it
        return None


Outcome = Measured | Failed | Pending


def outcome_of(result: AttemptResult) -> Measured | Failed:
    """A result measured here, as an outcome: `Failed` when it carries an error."""
    if result.error is not None:
        return Failed(result.attempt.name, result.error, result)
    return Measured(result)
