#!/usr/bin/env bash
# Starts a private PostgreSQL cluster and an MLflow tracking server on 127.0.0.1 for trying server mode,
# prints the MLFLOW_TRACKING_URI to export, and stops both on Ctrl-C.
#
#   scripts/local_server.sh                   # throw-away: data in a temporary folder, removed on stop
#   scripts/local_server.sh --dir ./.server   # keep the database and artifacts for the next start
#   scripts/local_server.sh stop --dir ./.server
#
# Needs PostgreSQL's server tools (Debian: apt-get install postgresql; or TRACKER_PG_BIN=<bin folder>)
# and psycopg2 in the active Python environment. The database password is $PGPASSWORD, else a generated
# one (kept in <dir>/postgres/.password, mode 0600); it is never printed. As root, PostgreSQL runs as the
# `postgres` system user (TRACKER_PG_OS_USER to change it).
set -euo pipefail
# The checkout's tracker package, also when it is not installed in the environment.
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m tracker.server "$@"
