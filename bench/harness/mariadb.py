"""A private, throwaway MariaDB server for the sysbench OLTP workload (paper §7.2.2).

The server gets its own datadir, socket, pid file and loopback port inside a temp
directory, so it neither reads `/etc/mysql` (`--no-defaults`) nor touches a system
instance. It is restarted for every run because in the gleaner configurations the
*server* is what runs under `gleaner run`; the sysbench client always runs outside.
Every start registers a stop on the cleanup stack, and the temp directory (with the
benchmark database and user) is removed when the workload is torn down.
"""

from __future__ import annotations

import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from . import proc
from .cleanup import CleanupStack

DATABASE = "gleaner_bench"
USER = "gleaner_bench"
PASSWORD = "gleaner_bench"
READY_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0


class MariaDBError(Exception):
    """The private MariaDB server could not be set up, started or stopped."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateServer:
    """Lifecycle of one private mariadbd: initialise once, start/stop per run, remove."""

    def __init__(self, stack: CleanupStack, os_user: str = "mysql") -> None:
        self.stack = stack
        self.os_user = os_user
        self.root: Path | None = None
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._stop_token: int | None = None
        self._remove_token: int | None = None

    # Paths inside the private directory; `run/` holds what mariadbd itself writes.
    @property
    def datadir(self) -> Path:
        return self._root() / "data"

    @property
    def rundir(self) -> Path:
        return self._root() / "run"

    @property
    def socket_path(self) -> Path:
        return self.rundir / "mysqld.sock"

    @property
    def error_log(self) -> Path:
        return self.rundir / "error.log"

    @property
    def initialised(self) -> bool:
        """False before `initialise()` and after `remove()` (e.g. by an interrupt)."""
        return self.root is not None

    def _root(self) -> Path:
        if self.root is None:
            raise MariaDBError("the private MariaDB directory has not been initialised")
        return self.root

    def initialise(self) -> None:
        """Creates the temp dir and an empty datadir with mariadb-install-db."""
        try:
            account = pwd.getpwnam(self.os_user)
        except KeyError as error:
            raise MariaDBError(f"no '{self.os_user}' user; install mariadb-server (bench/setup.sh)") from error
        self.root = Path(tempfile.mkdtemp(prefix="gleaner-bench-mariadb-"))
        self._remove_token = self.stack.push(f"remove {self.root}", self.remove)
        self.root.chmod(0o755)  # mariadbd drops to the mysql user and must traverse it
        for directory in (self.datadir, self.rundir):
            directory.mkdir()
            shutil.chown(directory, account.pw_uid, account.pw_gid)
        self.port = free_loopback_port()
        argv = [
            "mariadb-install-db",
            "--no-defaults",
            f"--user={self.os_user}",
            f"--datadir={self.datadir}",
            "--skip-test-db",
        ]
        result = proc.run(argv, self.stack, timeout_s=120)
        if result.returncode != 0:
            raise MariaDBError(f"mariadb-install-db failed: {proc.tail(result.output)}")

    def server_argv(self) -> list[str]:
        """The mariadbd command line (to be wrapped by a configuration)."""
        return [
            "mariadbd",
            "--no-defaults",
            f"--user={self.os_user}",
            "--bind-address=127.0.0.1",
            f"--port={self.port}",
            f"--socket={self.socket_path}",
            f"--datadir={self.datadir}",
            f"--pid-file={self.rundir / 'mysqld.pid'}",
            f"--log-error={self.error_log}",
            "--skip-name-resolve",
            # Keep the workload CPU/synchronisation bound rather than fsync bound,
            # and every run equally cold: no buffer-pool dump/reload across restarts.
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-buffer-pool-size=128M",
            "--innodb-buffer-pool-dump-at-shutdown=0",
            "--innodb-buffer-pool-load-at-startup=0",
        ]

    def start(self, argv: list[str]) -> None:
        """Starts the (possibly wrapped) server command and waits until it answers."""
        if self.process is not None:
            raise MariaDBError("the private MariaDB server is already running")
        log = (self._root() / "server-output.log").open("a")
        try:
            self.process, token = proc.start(argv, self.stack, "mariadbd", stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.stack.discard(token)  # replaced by the graceful stop below
        self._stop_token = self.stack.push(f"stop private mariadbd (pid {self.process.pid})", self.stop)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            returncode = self.process.poll()
            if returncode is not None:
                self._forget_process()
                raise MariaDBError(f"mariadbd exited with {returncode}: {self._log_tail()}")
            if self._admin("ping").returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise MariaDBError(f"mariadbd did not answer within {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def stop(self) -> None:
        """Clean shutdown through the socket; SIGTERM/SIGKILL the wrapper if that fails."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self._admin("shutdown")
            try:
                process.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.stop_process_group(process)
        self._forget_process()

    def _forget_process(self) -> None:
        self.process = None
        if self._stop_token is not None:
            self.stack.discard(self._stop_token)
            self._stop_token = None

    def sql(self, statements: str) -> None:
        """Runs SQL as the server's root account over the private socket."""
        argv = ["mariadb", "--no-defaults", f"--socket={self.socket_path}", "-uroot", "-e", statements]
        result = proc.run(argv, self.stack, timeout_s=60)
        if result.returncode != 0:
            raise MariaDBError(f"SQL failed ({statements[:60]}...): {proc.tail(result.output)}")

    def create_database(self) -> None:
        self.sql(
            f"CREATE DATABASE {DATABASE}; "
            f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; "
            f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1';"
        )

    def drop_database(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {DATABASE}; DROP USER IF EXISTS '{USER}'@'127.0.0.1';")

    def sysbench_args(self) -> list[str]:
        """Connection options for a sysbench client of this server."""
        return [
            "--db-driver=mysql",
            "--mysql-host=127.0.0.1",
            f"--mysql-port={self.port}",
            f"--mysql-user={USER}",
            f"--mysql-password={PASSWORD}",
            f"--mysql-db={DATABASE}",
        ]

    def remove(self) -> None:
        """Stops the server if needed and deletes the private directory."""
        self.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        if self._remove_token is not None:
            self.stack.discard(self._remove_token)
            self._remove_token = None

    def _admin(self, command: str) -> subprocess.CompletedProcess:
        argv = ["mariadb-admin", "--no-defaults", f"--socket={self.socket_path}", "-uroot", command]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=SHUTDOWN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            # Treated like any other failed admin command: the caller falls back to signals.
            return subprocess.CompletedProcess(argv, 124, "", "mariadb-admin timed out")

    def _log_tail(self) -> str:
        try:
            return proc.tail(self.error_log.read_text())
        except OSError:
            return f"(no {self.error_log})"
