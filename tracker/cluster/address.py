"""Reaching a Ray cluster: the address checked, the `ray` package found, the head reached, the measuring nodes
found; each failure a one-line error before any work."""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import dataclass
from types import ModuleType

from tracker.base.errors import TrackerError
from tracker.base.terminal import one_line

logger = logging.getLogger(__name__)

SLOT = "tracker_slot"  # the custom resource of a measuring node: one per node, so one timing per node at a time
INSTALL_HINT = "pip install 'onnx-optimization-tracker[cluster]'"
CONNECT_TIMEOUT_S = 10.0
# HOST:PORT (an IPv6 host in brackets), or ray://HOST:PORT (Ray Client, e.g. KubeRay's head service on 10001)
_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")
FORMS = "HOST:PORT (the head's GCS port, e.g. 127.0.0.1:6379), ray://HOST:PORT (Ray Client) or auto"
CLUSTER_HELP = ("measure on the nodes of the Ray cluster at ADDRESS that hold a tracker_slot, e.g. 127.0.0.1:6379 or "
                "ray://HEAD:10001 (needs the [cluster] extra); empty: here")


class ClusterError(TrackerError, ConnectionError):
    """A Ray cluster cannot be used: its address is malformed, it cannot be reached, or it has no measuring node."""


@dataclass(frozen=True)
class Address:
    """A Ray address as `ray.init` takes it, checked: `host` and `port` are None for "auto" (`RAY_ADDRESS`, else
    the cluster `ray start` left running on this machine)."""

    text: str
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Address:
        """Raises:
        ClusterError: `text` is none of `FORMS`, or its port is out of range (the message names both)."""
        text = str(text).strip()
        if text == "auto":
            return cls(text)
        match = _ADDRESS.fullmatch(text)
        if match is None or not 0 < int(match["port"]) < 65536:
            raise ClusterError(f"--cluster {text!r} is not a Ray address; expected {FORMS}")
        return cls(text, host=match["host"].strip("[]"), port=int(match["port"]))


def ray_missing_message() -> str:
    """What `--cluster` says when `ray` is not installed."""
    return f"--cluster needs Ray, which is not installed: {INSTALL_HINT}"


def import_ray() -> ModuleType:
    """The `ray` package.

    Raises:
        ClusterError: it is not installed (`ray_missing_message`).
    """
    try:
        import ray
    except ImportError:
        raise ClusterError(ray_missing_message()) from None
    return ray


def check_reachable(address: Address, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Opens and closes one TCP connection to the head: `ray.init` retries an unreachable address for minutes.

    Raises:
        ClusterError: the head does not answer within `timeout_s`.
    """
    if address.host is None or address.port is None:
        return  # "auto": ray.init finds the address itself, and says so when it finds none
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout_s):
            pass
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address.text} ({type(e).__name__}: "
                           f"{e.strerror or e}); start its head (`ray start --head --port {address.port}`), or "
                           f"check --cluster (expected {FORMS})") from None


def connect(address: Address, *, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Connects this process to the cluster at `address` (`ray.init`); returns whether it did (False: it already
    was, and stays connected after the study).

    Raises:
        ClusterError: Ray is missing, the cluster cannot be reached, or `ray.init` failed.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    check_reachable(address, timeout_s=timeout_s)
    try:  # the nodes' own log lines (each measurement's progress) show on this process's stderr
        ray.init(address=address.text, log_to_driver=True, logging_level=logging.WARNING)
    except Exception as e:
        raise ClusterError(f"could not connect to the Ray cluster at {address.text}: {type(e).__name__}: "
                           f"{one_line(str(e))}") from None
    return True


def measuring_nodes(address: Address) -> list[str]:
    """The ids of the cluster's live nodes that hold a `tracker_slot`.

    Raises:
        ClusterError: there is none.
    """
    ray = import_ray()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(SLOT, 0) >= 1]
    if not nodes:
        raise ClusterError(f"the Ray cluster at {address.text} has no live node with a {SLOT!r} resource; start each "
                           f"measuring node with `ray start ... --resources '{{\"{SLOT}\": 1}}'`")
    return nodes
