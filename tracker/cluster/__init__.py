"""A study's measurements fanned out over a Ray cluster (`Study(..., cluster=ADDRESS)`, `tracker optimize MODEL
--cluster ADDRESS`).

Candidates are made where the study runs (the driver); each measurement runs on a node holding one `tracker_slot`
resource, in a `NodeMeasurer` actor pinned there (`node`), so two timings never share a node. Each node measures
the study's baseline itself and judges its attempts against it, in its own process, as a local study does. A node
returns the attempt's record, the outbox's format (`tracker.run.record`), and the driver logs it or keeps it in the
outbox (`driver`).

Files travel through Ray's object store, not a shared artifact location: the model's files (with its external
data) go to the node as bytes, and the record comes back as one tar of `record.json` and the files it names (its
tables and charts, the profile, the model). So a node needs no shared filesystem, no tracking-store credentials and
no route to the store: a team's `mlflow-artifacts:` proxy or its bucket may be unreachable from the nodes, and only
the driver logs (`wire`).

Scope: the forward scenario, and a search (`Study.search`): its candidates are made and checked on the driver, and
screened on the nodes, several at once, each against its node's baseline. A generation scenario or a check on real
text on a cluster is refused before any work.

The package itself holds only what reaching a cluster needs (`address`), so the command line's parser stays light:
the driver is `tracker.cluster.driver`, the nodes' side `tracker.cluster.node`.
"""

from tracker.cluster.address import CLUSTER_HELP, INSTALL_HINT, SLOT, Address, ClusterError, ray_missing_message

__all__ = ["CLUSTER_HELP", "INSTALL_HINT", "SLOT", "Address", "ClusterError", "ray_missing_message"]
