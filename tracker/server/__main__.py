"""`python -m tracker.server`: start PostgreSQL + `mlflow server` on 127.0.0.1 until Ctrl-C, or stop them."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tracker import server
from tracker.errors import TrackerError
from tracker.server.common import LocalServerError
from tracker.server.mlflow_server import LocalTrackingServer


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tracker.server [start] [--dir DIR] [--port N]` or `... stop --dir DIR`."""
    parser = argparse.ArgumentParser(prog="python -m tracker.server", description=server.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("start", "stop"), default="start")
    parser.add_argument("--dir", type=Path, help="keep the database and artifacts here (default: a temporary "
                        "folder, removed on stop)")
    parser.add_argument("--port", type=int, default=None, help="MLflow server port (default: a free one)")
    parser.add_argument("--pg-port", type=int, default=None, help="PostgreSQL port (default: a free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command == "stop":
        return _stop_running(args.dir, parser)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="tracker-server-"))
    if args.dir is None:
        folder.chmod(0o711)  # PostgreSQL's own user must pass through it when we are root
    try:
        return _serve(LocalTrackingServer(folder, port=args.port, pg_port=args.pg_port), folder / "server.pid")
    except TrackerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def _serve(server: LocalTrackingServer, pid_file: Path) -> int:
    if pid_file.exists() and _alive(int(pid_file.read_text() or 0)):
        raise LocalServerError(f"already running (pid {pid_file.read_text()}); stop it first")
    # SIGTERM (the stop command, a service manager) stops both servers like Ctrl-C does. So does SIGINT, also when
    # started from a shell without job control in the background (`... &` in a script), which leaves it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server.start()
    pid_file.write_text(str(os.getpid()))
    try:
        print(f"MLflow server on PostgreSQL is up; data in {server.folder}", flush=True)
        print(f"  export MLFLOW_TRACKING_URI={server.tracking_uri}", flush=True)
        print(f"UI: {server.tracking_uri}   Ctrl-C stops both (or: python -m tracker.server stop --dir "
              f"{server.folder})", flush=True)
        while server.mlflow.running:
            time.sleep(0.5)
        print("mlflow server exited; see " + str(server.mlflow.log_path), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave PostgreSQL running
        try:
            server.stop()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            pid_file.unlink(missing_ok=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop_running(folder: Path | None, parser: argparse.ArgumentParser) -> int:
    if folder is None:
        parser.error("stop needs --dir, the folder the server was started with")
    pid_file = folder / "server.pid"
    if not pid_file.exists():
        print(f"no server running from {folder}", file=sys.stderr)
        return 1
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return 0 if not _alive(pid) else 1


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
