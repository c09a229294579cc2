"""A real Ray cluster of several node processes on this machine, for tests/cluster/ and bench_cluster.py; run as
a script, the driver they run (`python local_cluster.py optimize MODEL ...`: `tracker optimize` measuring no
machine roofs, ~7 s per node that these runs do not look at).

Each node is `ray start ... --block` holding one `tracker_slot`, each with its own temporary folder; the nodes and
the driver run inside a private network namespace where only loopback exists (`unshare -n`, as root). Ray 2.60
advertises the machine's own address even when told `--node-ip-address 127.0.0.1`; in the namespace there is no
other address, so nothing leaves loopback, and every port is free there. The cluster is stopped by killing the
process groups this started, never `ray stop` (which stops every Ray on the machine).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PORT = 6379  # the head's, inside the namespace
ADDRESS = f"127.0.0.1:{PORT}"
RAY = Path(sys.executable).parent / "ray"
# Ray notices a node that stopped answering within ~3 s, not its default ~30 s: a test that kills a node waits less.
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                      "RAY_health_check_failure_threshold": "3"}


def namespace_error() -> str | None:
    """Why a private network namespace cannot be made here (not root, no `unshare` or `ip`), or None."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    tried = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if tried.returncode != 0:
        return f"`unshare -n` is not permitted here ({tried.stderr.strip() or tried.returncode})"
    return None


def script(driver: list[str], *, nodes: int, temp: Path, labels: list[str] | None = None,
           kill_node_when: str | None = None, interrupt_when: str | None = None) -> str:
    """The bash script run in the namespace: loopback up, `nodes` nodes started (the head first), the driver run
    once they are all up, every node's process group killed on exit. The driver's exit status is the script's.

    Args:
        driver: the driver's command line.
        nodes: node processes, each with one `tracker_slot` and one Ray CPU.
        temp: a short folder (Ray's socket paths must stay under 107 characters): node `i` keeps its files in
            `temp/<i>`, its log in `temp/node<i>.log`.
        labels: node `i`'s `tracker_node_type` label, if any (a hardware type of its own).
        kill_node_when: an extended regular expression: once a line of node 1's worker logs matches it, node 1's
            process group is killed (SIGKILL), as a machine that goes away.
        interrupt_when: the same, on any node's worker logs: then the driver gets SIGINT, as from Ctrl-C.
    """
    # -m: each background job in a process group of its own (a node: killed whole), the driver taking SIGINT
    lines = ["set -u", "set -m", "ip link set lo up", "pids=()",
             'trap \'for p in "${pids[@]}"; do kill -KILL -- -$p 2>/dev/null; done\' EXIT']
    for i in range(nodes):
        where = f"--head --port {PORT} --include-dashboard false" if i == 0 else f"--address {ADDRESS}"
        label = f" --labels tracker_node_type={labels[i]}" if labels and labels[i] else ""
        lines += [f"{shlex.quote(str(RAY))} start {where} --node-ip-address 127.0.0.1 --num-cpus 1 "
                  f"--resources '{{\"tracker_slot\": 1}}' --temp-dir {temp}/{i} "
                  f"--disable-usage-stats{label} --block > {temp}/node{i}.log 2>&1 &",
                  f"pids+=($!); echo $! >> {temp}/pids",
                  # the head answers before the others join; each node says when it is up
                  f"until grep -q 'Ray runtime started' {temp}/node{i}.log; do kill -0 $! || "
                  f"{{ echo 'node {i} did not start' >&2; exit 3; }}; sleep 0.1; done"]
    lines += [f"{shlex.join(driver)} &", "driver=$!"]
    for pattern, logs, action in ((kill_node_when, f"{temp}/1", "kill -KILL -- -${pids[1]}"),
                                  (interrupt_when, f"{temp}/*", "kill -INT $driver")):
        if pattern is not None:
            lines.append(f"(until cat {logs}/session_*/logs/worker-*.err 2>/dev/null | grep -qE "
                         f"{shlex.quote(pattern)}; do sleep 0.1; done; {action}; echo '{action}' >&2) &")
    lines.append("wait $driver")
    return "\n".join(lines) + "\n"


def run(driver: list[str], *, nodes: int, cwd: Path, env: dict[str, str] | None = None,
        labels: list[str] | None = None, kill_node_when: str | None = None, interrupt_when: str | None = None,
        timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Runs `driver` (which reaches the cluster at `ADDRESS`) on a new cluster of `nodes` nodes in a private network
    namespace, in `cwd`; returns the driver's completed process (its stderr then the nodes' logs)."""
    temp = Path(tempfile.mkdtemp(prefix="tr-ray-"))
    try:
        text = script(driver, nodes=nodes, temp=temp, labels=labels, kill_node_when=kill_node_when,
                      interrupt_when=interrupt_when)
        # SIGINT back to its default: a shell's `&` job starts with it ignored, and every process here would inherit
        # that, the driver's Ctrl-C (`interrupt_when`) included
        done = subprocess.run(["unshare", "-n", "bash", "-c", text], cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, **FAST_HEALTH_CHECKS, **(env or {})}, timeout=timeout_s,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except BaseException:  # a timeout kills only the script: its trap did not stop the nodes
        for pid in (temp / "pids").read_text().split() if (temp / "pids").exists() else []:
            subprocess.run(["kill", "-KILL", "--", f"-{pid}"], capture_output=True)
        raise
    else:
        done.stderr += "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                               for p in sorted(temp.glob("*.log")))
        return done
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def optimize(argv: list[str]) -> int:
    """`tracker optimize` with `argv`, in this process, with no machine roofs measured (nor, then, on the nodes)."""
    import tracker.study.study
    from tracker.cli import main

    tracker.study.study.measure_machine_or_none = lambda: None
    return main(["optimize", *argv])


if __name__ == "__main__":
    if sys.argv[1:2] != ["optimize"]:
        sys.exit(f"usage: {sys.argv[0]} optimize MODEL [tracker optimize's options]")
    sys.exit(optimize(sys.argv[2:]))
