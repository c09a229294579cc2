"""A private PostgreSQL cluster on 127.0.0.1: created with initdb, started and stopped with pg_ctl."""

from __future__ import annotations

import glob
import logging
import os
import pwd
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tracker.server.common import HOST, LocalServerError, free_port

logger = logging.getLogger(__name__)

PG_BIN_ENV = "TRACKER_PG_BIN"  # folder holding initdb, pg_ctl, createdb
PG_OS_USER_ENV = "TRACKER_PG_OS_USER"  # who runs PostgreSQL when we are root (default: postgres)
_PG_TOOLS = ("initdb", "pg_ctl", "createdb")


def find_postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server tools: `$TRACKER_PG_BIN`, the PATH, or the newest
    `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql` package); None if there is none."""
    candidates = [Path(os.environ[PG_BIN_ENV])] if os.environ.get(PG_BIN_ENV) else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)  # often a symlink into the real folder
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted((Path(p) for p in debian), key=lambda p: _version(p.parent.name), reverse=True)
    candidates.append(Path("/usr/local/pgsql/bin"))
    return next((c for c in candidates if all((c / t).is_file() for t in _PG_TOOLS)), None)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


class LocalPostgres:
    """A PostgreSQL cluster in `folder`, listening on 127.0.0.1 only (no Unix socket), one database.

    As root it runs as an unprivileged system user (PostgreSQL refuses root): `$TRACKER_PG_OS_USER`,
    else `postgres`, else `nobody`; `folder` is handed to that user and its parents must let it pass.
    """

    def __init__(
        self, folder: str | Path, *, port: int | None = None, user: str = "tracker", database: str = "mlflow",
        password: str | None = None, bin_dir: str | Path | None = None,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.port = port or free_port()
        self.user = user
        self.database = database
        found = Path(bin_dir) if bin_dir else find_postgres_bin()
        if found is None:
            raise LocalServerError(
                f"PostgreSQL server tools ({', '.join(_PG_TOOLS)}) not found in ${PG_BIN_ENV}, the PATH or "
                "/usr/lib/postgresql/*/bin: `apt-get install postgresql`, or set " + PG_BIN_ENV
            )
        self.bin_dir = found
        self._password_file = self.folder / ".password"
        known = password or os.environ.get("PGPASSWORD") or self._read_stored_password()
        self._store_password = known is None
        self._password = known if known is not None else secrets.token_urlsafe(24)
        self._os_user = _os_user() if os.geteuid() == 0 else None

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def log_path(self) -> Path:
        return self.folder / "postgres.log"

    @property
    def backend_store_uri(self) -> str:
        """The SQLAlchemy URI for `mlflow server`, without the password (libpq reads `PGPASSWORD`)."""
        return f"postgresql+psycopg2://{self.user}@{HOST}:{self.port}/{self.database}"

    def client_env(self) -> dict[str, str]:
        """What a client process (createdb, `mlflow server`) needs in its environment to log in."""
        return {"PGPASSWORD": self._password}

    def start(self, *, timeout_s: float = 60) -> None:
        """Creates the cluster and its database on first use, then starts it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._os_user is not None:
            _check_reachable_by(self.folder, self._os_user)
            os.chown(self.folder, self._os_user.pw_uid, self._os_user.pw_gid)
        self.folder.chmod(0o700)
        fresh = not (self.data_dir / "PG_VERSION").exists()
        if self._store_password:
            if not fresh:
                raise LocalServerError(f"{self.data_dir} exists but its password is unknown: set PGPASSWORD")
            self._password_file.touch(mode=0o600)
            self._password_file.write_text(self._password)
            self._store_password = False
        if fresh:
            self._initdb()
        # pg_ctl hands -o to the postmaster through a shell: '' is an empty value, no Unix socket.
        options = f"-c listen_addresses={HOST} -c port={self.port} -c unix_socket_directories=''"
        self._pg_ctl("start", "-w", "-t", str(int(timeout_s)), "-l", str(self.log_path), "-o", options)
        if fresh:
            self._run([str(self.bin_dir / "createdb"), "-h", HOST, "-p", str(self.port), "-U", self.user,
                       self.database], env={**os.environ, **self.client_env()}, as_os_user=False)
        logger.info("PostgreSQL on %s:%d, data in %s", HOST, self.port, self.data_dir)

    def stop(self) -> None:
        """Stops the cluster (fast shutdown: open sessions are ended); no-op if it is not running."""
        if (self.data_dir / "postmaster.pid").exists():
            self._pg_ctl("stop", "-w", "-m", "fast")

    def _read_stored_password(self) -> str | None:
        try:
            return self._password_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def _initdb(self) -> None:
        pwfile = self.folder / ".initdb-password"
        pwfile.touch(mode=0o600)
        try:
            pwfile.write_text(self._password)
            if self._os_user is not None:
                os.chown(pwfile, self._os_user.pw_uid, self._os_user.pw_gid)
            # --no-sync: a cluster that crashes during its own creation is simply created again.
            self._run([str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
                       "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C",
                       "--no-sync", "--no-instructions"])
        finally:
            pwfile.unlink(missing_ok=True)

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _run(self, cmd: list[str], *, env: dict[str, str] | None = None, as_os_user: bool = True) -> None:
        kwargs: dict[str, Any] = {}  # subprocess.run's user, group and extra_groups
        if as_os_user and self._os_user is not None:
            u = self._os_user
            kwargs = {"user": u.pw_uid, "group": u.pw_gid, "extra_groups": []}
            env = {**(env or os.environ), "HOME": str(self.folder), "USER": u.pw_name}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              cwd=self.folder, **kwargs)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            if self._password:
                output = output.replace(self._password, "***")
            raise LocalServerError(f"{Path(cmd[0]).name} {' '.join(cmd[1:3])}... failed ({done.returncode}): {output}"
                                   + (f"\nsee {self.log_path}" if self.log_path.exists() else ""))


def _os_user() -> pwd.struct_passwd:
    names = [os.environ[PG_OS_USER_ENV]] if os.environ.get(PG_OS_USER_ENV) else ["postgres", "nobody"]
    for name in names:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise LocalServerError(f"no system user {' or '.join(names)} to run PostgreSQL as (it refuses root)")


def _check_reachable_by(folder: Path, user: pwd.struct_passwd) -> None:
    for parent in folder.parents:
        st = parent.stat()
        if not (st.st_mode & 0o001 or (st.st_uid == user.pw_uid and st.st_mode & 0o100)):
            raise LocalServerError(
                f"{parent} does not let the '{user.pw_name}' user that runs PostgreSQL through (mode "
                f"{oct(st.st_mode & 0o777)}): choose a folder elsewhere (e.g. under /tmp) or `chmod o+x {parent}`"
            )
