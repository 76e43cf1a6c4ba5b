"""Deterministic pigz input and the private MariaDB command lines."""

from harness.cleanup import CleanupStack
from harness.mariadb import PrivateServer
from harness.workloads import generate_text


def test_generated_text_is_exact_size_and_reproducible(tmp_path):
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_text(first, 300_000, seed=7)
    generate_text(second, 300_000, seed=7)
    generate_text(other, 300_000, seed=8)
    assert first.stat().st_size == 300_000
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()


def test_private_server_uses_only_its_own_paths(tmp_path):
    server = PrivateServer(CleanupStack())
    server.root, server.port = tmp_path, 34567
    argv = server.server_argv()
    assert argv[:2] == ["mariadbd", "--no-defaults"]  # never reads /etc/mysql
    assert "--bind-address=127.0.0.1" in argv and "--port=34567" in argv
    assert f"--socket={tmp_path}/run/mysqld.sock" in argv
    assert f"--datadir={tmp_path}/data" in argv
    assert "--mysql-port=34567" in server.sysbench_args()
