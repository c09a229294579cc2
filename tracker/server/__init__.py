"""A private PostgreSQL cluster and an `mlflow server` on 127.0.0.1, for trying server mode and for tests.

`python -m tracker.server [--dir DIR]` starts both, prints the `MLFLOW_TRACKING_URI` to export and
stops both on Ctrl-C (or `python -m tracker.server stop --dir DIR`). The database password comes from
`PGPASSWORD`, else it is generated (and kept in `DIR/postgres/.password`, mode 0600, to restart the
same cluster); it is handed to PostgreSQL and MLflow through files and the environment, never on a
command line or in a log.
"""

from tracker.server.common import HOST, LocalServerError, free_port, health_ok
from tracker.server.mlflow_server import LocalMlflowServer, LocalTrackingServer
from tracker.server.postgres import LocalPostgres, find_postgres_bin

__all__ = [
    "HOST", "LocalMlflowServer", "LocalPostgres", "LocalServerError", "LocalTrackingServer", "find_postgres_bin",
    "free_port", "health_ok",
]
