"""What a study holds open while its `with` block runs, as MLflow's `ActiveRun` holds a run: the tracking store set up,
the outbox checked, SIGTERM unwinding like Ctrl-C, the work folder (made unless given), and the study's parent run;
closing it ends the run (FINISHED, or FAILED when the study unwinds from an exception) and removes what it made."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tracker.base.files import make_work_folder
from tracker.base.termination import sigterm_as_exit
from tracker.run.record import check_outbox
from tracker.store import connect, write


class StudyContext:
    """A study's tracking store, outbox, SIGTERM handling, work folder and parent run, opened in that order.

    Args:
        name: the study's name.
        experiment: the experiment of its run (`write.study_run`).
        tracking_uri: the tracking store (`connect.setup_tracking`).
        workdir: the study's work folder; None: one is made, and removed at the end.
        tags: the study run's tags.
    """

    def __init__(self, name: str, *, experiment: str | None, tracking_uri: str | None, workdir: str | Path | None,
                 tags: Mapping[str, str]) -> None:
        self.name, self.experiment, self.tracking_uri, self.tags = name, experiment, tracking_uri, tags
        self._workdir_given, self._workdir = bool(workdir), Path(workdir) if workdir else None
        self._run_cm: AbstractContextManager[Any] | None = None  # the study run's, while the study is open
        self._sigterm: AbstractContextManager[None] | None = None

    def prepare(self) -> None:
        """Before any work: the tracking store set up, a place for what the store may not take (the outbox), and
        SIGTERM (`timeout`, a CI cancel) unwinding like Ctrl-C: runs end FAILED, the work folder goes."""
        connect.setup_tracking(self.tracking_uri)
        check_outbox()
        self._sigterm = sigterm_as_exit()
        self._sigterm.__enter__()

    def make_work_folder(self) -> None:
        """The study's work folder, made unless one was given."""
        if self._workdir is None:
            self._workdir = make_work_folder(f"tracker-{self.name}-")  # a killed study's folder goes

    def open_run(self, params: Mapping[str, str]) -> Any:
        """Opens the study's parent run (`write.study_run`) with `params`; returns it (MLflow's `Run`)."""
        self._run_cm = write.study_run(self.name, experiment=self.experiment, params=params, tags=self.tags)
        return self._run_cm.__enter__()

    def check_open(self, doing: str) -> None:
        """Raises `RuntimeError` unless the study's run is open: `doing` needs the `with` block."""
        if self._run_cm is None:
            raise RuntimeError(f"use the Study in a `with` block before {doing}")

    @property
    def work(self) -> Path:
        """The study's work folder (made on entry when none was given)."""
        if self._workdir is None:
            raise RuntimeError("use the Study in a `with` block: its work folder is made on entry")
        return self._workdir

    def close(self, exc_type, exc, tb) -> None:
        """Ends the study's run (FAILED when `exc` is what the study unwinds from), then `release`."""
        if self._run_cm is not None:
            self._run_cm.__exit__(exc_type, exc, tb)
        self._run_cm = None
        self.release()

    def release(self) -> None:
        """Removes the work folder the study made and restores SIGTERM's handler."""
        if not self._workdir_given and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        if self._sigterm is not None:
            self._sigterm.__exit__(None, None, None)
