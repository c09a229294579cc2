"""`python -m tracker.server`: start PostgreSQL + `mlflow server` on 127.0.0.1 until Ctrl-C, or stop them."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from tracker import server
from tracker.base.errors import TrackerError
from tracker.server.common import LocalServerError, require_free_port
from tracker.server.mlflow_server import LocalTrackingServer
from tracker.server.pidfile import StalePidFile, running_server, write_pid_file


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tracker.server [start] [--dir DIR] [--port N]` or `... stop --dir DIR`."""
    parser = argparse.ArgumentParser(prog="python -m tracker.server", description=server.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("start", "stop"), default="start")
    parser.add_argument("--dir", type=Path, help="keep the database and artifacts here (default: a temporary "
                        "folder, removed on stop)")
    parser.add_argument("--port", type=_port, default=None, help="MLflow server port (default: a free one)")
    parser.add_argument("--pg-port", type=_port, default=None, help="PostgreSQL port (default: a free one)")
    args = parser.parse_args(argv)
    if args.port is not None and args.port == args.pg_port:
        parser.error(f"--port and --pg-port must differ (both {args.port})")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.command == "stop":
        return _stop_running(args.dir, parser)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="tracker-server-"))
    if args.dir is None:
        folder.chmod(0o711)  # PostgreSQL's own user must pass through it when we are root
    code = 2
    try:
        _check_not_running(folder / "server.pid")
        for option, port in (("--port", args.port), ("--pg-port", args.pg_port)):
            if port is not None:
                _check_free(port, option)
        code = _serve(LocalTrackingServer(folder, port=args.port, pg_port=args.pg_port), folder / "server.pid")
        return code
    except TrackerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.dir is None:
            _remove_temporary(folder, keep_logs=code != 0)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port, 1..65535, got {text!r}")
    return port


def _check_not_running(pid_file: Path) -> None:
    try:
        process = running_server(pid_file)
    except StalePidFile as e:
        pid_file.unlink(missing_ok=True)
        print(f"{e}; removed it", file=sys.stderr, flush=True)
        return
    if process is not None:
        raise LocalServerError(f"a server from {pid_file.parent} is already running (pid {process.pid}); stop it "
                               f"first: python -m tracker.server stop --dir {pid_file.parent}")


def _check_free(port: int, option: str) -> None:
    try:
        require_free_port(port)
    except LocalServerError as e:
        raise LocalServerError(f"{e}; choose another {option} or omit it") from None


def _serve(server: LocalTrackingServer, pid_file: Path) -> int:
    # SIGTERM (the stop command, a service manager) stops both servers like Ctrl-C does. So does SIGINT, also when
    # started from a shell without job control in the background (`... &` in a script), which leaves it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server.start()
    write_pid_file(pid_file)
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
    try:
        process = running_server(pid_file)
    except StalePidFile as e:
        pid_file.unlink(missing_ok=True)
        print(f"error: {e}; removed it, nothing stopped", file=sys.stderr)
        return 1
    if process is None:
        print(f"no server running from {folder}", file=sys.stderr)
        return 1
    try:
        process.terminate()  # psutil refuses to signal a process that is no longer the one it found
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        print(f"error: not allowed to stop the server (pid {process.pid}) started by another user", file=sys.stderr)
        return 1
    deadline = time.monotonic() + 60
    while not _ended(process):
        if time.monotonic() > deadline:
            print(f"error: the server (pid {process.pid}) is still stopping after 60 s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"stopped the server from {folder} (pid {process.pid})", file=sys.stderr)
    return 0


def _ended(process: psutil.Process) -> bool:
    """Gone, or a zombie its parent has not reaped yet (a shell that started it in the background, say)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _remove_temporary(folder: Path, *, keep_logs: bool) -> None:
    """Removes a temporary server folder; after a failure, all but its logs, which a message may name."""
    if not keep_logs:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in sorted(folder.rglob("*"), reverse=True):  # a folder's content before the folder
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.suffix != ".log":
            path.unlink(missing_ok=True)
    if any(folder.iterdir()):
        print(f"the logs are kept in {folder}", file=sys.stderr)
    else:
        folder.rmdir()


if __name__ == "__main__":
    sys.exit(main())
