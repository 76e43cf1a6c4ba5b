"""Preflight: flag discovery, gleaner capability check against a fake CLI, load check."""

import stat
import sys
import textwrap

import pytest

from harness import preflight

HELP_SCRIPT = textwrap.dedent(
    """\
    #!{python}
    import sys
    helps = {{
        ("run",): "Usage: gleaner run [--timeline <PATH>] [--mode <MODE>] -- <CMD>...\\n"
                  "  possible values: gleaner, retention, consolidation",
        ("probe",): "Usage: gleaner probe [--json]",
        ("workload", "pipeline"): "Usage: gleaner workload pipeline [--work <N>] [--duration <D>] [--json]",
    }}
    text = helps.get(tuple(sys.argv[1:-1]))
    if text is None:
        print("error: unrecognized subcommand", file=sys.stderr)
        sys.exit(2)
    print(text)
    """
)


@pytest.fixture
def fake_gleaner(tmp_path):
    path = tmp_path / "gleaner"
    path.write_text(HELP_SCRIPT.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_long_flags():
    assert preflight.long_flags(["x", "--work", "500", "--duration=2s", "-v", "--json"]) == [
        "--work", "--duration", "--json"]


def test_capable_gleaner_passes(fake_gleaner):
    needs = preflight.GleanerNeeds(
        run_timeline=True, modes=("retention",), probe=True,
        workloads=(("pipeline", ("--work", "--duration", "--json")),))
    preflight.check_gleaner(fake_gleaner, needs)


def test_missing_mode_subcommand_and_flag_are_all_listed(fake_gleaner):
    needs = preflight.GleanerNeeds(
        modes=("always-yield",), probe=True, probe_flags=("--samples",),
        workloads=(("pipeline", ("--phases",)), ("matmul", ("--duration",))))
    with pytest.raises(preflight.PreflightError) as error:
        preflight.check_gleaner(fake_gleaner, needs)
    message = str(error.value)
    assert "`gleaner run --mode always-yield`" in message
    assert "`gleaner workload pipeline --phases`" in message
    assert "`gleaner workload matmul`" in message
    assert "`gleaner probe --samples`" in message and "`gleaner probe --json`" not in message
    assert "cargo build --release -p gleaner" in message


def test_missing_binary_says_how_to_build(tmp_path):
    with pytest.raises(preflight.PreflightError, match="cargo build --release -p gleaner"):
        preflight.check_gleaner(tmp_path / "gleaner", preflight.GleanerNeeds())


def test_load_check_threshold():
    assert preflight.load_check((0.3, 1.0, 1.0)) is None
    warning = preflight.load_check((0.31, 0.0, 0.0))
    assert "0.31" in warning and "not evidence" in warning


def test_read_loadavg(tmp_path):
    path = tmp_path / "loadavg"
    path.write_text("0.07 0.21 0.11 1/89 7041\n")
    assert preflight.read_loadavg(path) == (0.07, 0.21, 0.11)


def test_missing_tools_without_setup_names_the_command():
    with pytest.raises(preflight.PreflightError, match="setup.sh"):
        preflight.ensure_tools({"definitely-not-a-tool-xyz"}, allow_setup=False)
    assert preflight.missing_tools({"sh"}, have_matplotlib=False) == ["matplotlib"]
