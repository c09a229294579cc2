"""Command line: `tracker optimize|summarize|profile|inspect|upload|compare|check` (also `python -m tracker`): `main`
parses the arguments (`parser`), runs the command (`commands`) and turns what goes wrong into an exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tracker.base.errors import TrackerError
from tracker.base.files import no_space_note, working_folder
from tracker.base.terminal import setup_logging
from tracker.base.termination import EXIT_CODE, received, sigterm_as_exit
from tracker.cli.commands import error
from tracker.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `tracker` command on `argv` (default: the process's arguments) and returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(progress=getattr(args, "progress", True))
    try:
        working_folder()  # one line, not a traceback from the first os.getcwd, when it was removed
        with sigterm_as_exit():  # `timeout`, a CI cancel: runs end FAILED, exit 143
            return args.func(args)
    except (TrackerError, ValueError, ConnectionError) as e:
        error(str(e))
        return 2
    except Exception as e:
        if received():  # SIGTERM that surfaced as another error (e.g. an ImportError from a cut import)
            print("terminated (SIGTERM): runs logged so far are kept; the run that was cut is FAILED", file=sys.stderr)
            return EXIT_CODE
        if not no_space_note(e):
            raise
        error(f"{type(e).__name__}: {e}{no_space_note(e)}")  # a full disk: which folder, not a traceback
        return 2
    except KeyboardInterrupt:  # what was logged stays; open runs were ended FAILED on the way out
        print("interrupted (Ctrl-C): runs logged so far are kept; the run that was cut is FAILED", file=sys.stderr)
        return 130
