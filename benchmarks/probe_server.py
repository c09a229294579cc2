"""Probe cases of issue 22, items 7 and 8: `python -m tracker.server` against a pid file or a port that is not its own.

Each case runs the script from outside in an empty folder and returns (held, one-line observation). None of them
starts PostgreSQL where the script behaves as the issue asks; where it does not (an older checkout), the server it
starts is stopped by the script itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from probe_common import Case, bystander, foreign_service, last_line, run_cases


def _script(tmp: Path, *args: str, timeout_s: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tracker.server", *args], cwd=tmp, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout_s, env=os.environ.copy())
    return done, time.monotonic() - started


def stop_with_an_unrelated_pid(tmp: Path) -> tuple[bool, str]:
    with bystander() as other:
        (tmp / "server.pid").write_text(str(other.pid))
        done, _ = _script(tmp, "stop", "--dir", str(tmp), timeout_s=90)
        time.sleep(0.2)
        alive = other.poll() is None
    held = alive and done.returncode != 0 and "Traceback" not in done.stderr and "stale" in done.stderr
    return held, f"rc {done.returncode}, unrelated process {'alive' if alive else 'KILLED'}: {last_line(done)}"


def stop_with_a_garbled_pid_file(tmp: Path) -> tuple[bool, str]:
    (tmp / "server.pid").write_text("not-a-pid")
    done, _ = _script(tmp, "stop", "--dir", str(tmp), timeout_s=90)
    one_line = len(done.stderr.strip().splitlines()) == 1
    held = done.returncode != 0 and "Traceback" not in done.stderr and one_line
    return held, f"rc {done.returncode}: {last_line(done)}"


def start_with_a_stale_pid_file(tmp: Path) -> tuple[bool, str]:
    # The pid names a live unrelated process; a port in use stops the start right after the pid check, before
    # PostgreSQL, where the script goes on past the stale file.
    with bystander() as other, foreign_service() as port:
        (tmp / "server.pid").write_text(str(other.pid))
        done, _ = _script(tmp, "start", "--dir", str(tmp), "--port", str(port))
    held = "already running" not in done.stderr and "stale" in done.stderr
    return held, f"rc {done.returncode}: {last_line(done)}"


def port_of_another_http_service(tmp: Path) -> tuple[bool, str]:
    tmp.chmod(0o711)  # where the script goes on to start PostgreSQL as root, its own user must pass through
    with foreign_service() as port:
        done, seconds = _script(tmp, "start", "--dir", str(tmp / "server"), "--port", str(port))
    exported = "export MLFLOW_TRACKING_URI" in done.stdout
    held = done.returncode != 0 and not exported and "in use" in done.stderr and seconds < 10
    return held, (f"rc {done.returncode} in {seconds:.1f} s, {'printed' if exported else 'no'} export line: "
                  f"{last_line(done)}")


def port_out_of_range(tmp: Path) -> tuple[bool, str]:
    done, seconds = _script(tmp, "--port", "99999")
    held = done.returncode == 2 and seconds < 5 and "Traceback" not in done.stderr
    return held, f"rc {done.returncode} in {seconds:.1f} s: {last_line(done)}"


CASES: list[Case] = [
    ("7", "stop --dir with server.pid naming an unrelated process", stop_with_an_unrelated_pid),
    ("7", "stop --dir with a non-numeric server.pid", stop_with_a_garbled_pid_file),
    ("7", "start --dir with a stale server.pid", start_with_a_stale_pid_file),
    ("8", "--port held by another HTTP service answering /health", port_of_another_http_service),
    ("8", "--port 99999", port_out_of_range),
]


if __name__ == "__main__":
    sys.exit(run_cases(CASES))
