"""Configuration selection, command wrapping and the interleaved run order."""

from pathlib import Path

import pytest

from harness.configs import CONFIGS, interleave, select_configs

GLEANER = Path("/opt/gleaner")


def by_name(name):
    return next(config for config in CONFIGS if config.name == name)


def test_interleave_is_round_robin_over_configs():
    order = interleave(["A", "B", "C"], 2)
    assert order == [(0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C")]


def test_interleave_rejects_zero_reps():
    with pytest.raises(ValueError, match="at least 1"):
        interleave(["A"], 0)


def test_select_keeps_canonical_order_and_requires_baseline():
    assert [c.name for c in select_configs(["one-vcpu", "baseline", "gleaner"])] == ["baseline", "gleaner", "one-vcpu"]
    with pytest.raises(ValueError, match="baseline"):
        select_configs(["gleaner"])
    with pytest.raises(ValueError, match="unknown configuration"):
        select_configs(["baseline", "turbo"])
    assert len(select_configs(None)) == 8
    assert select_configs(None)[-1].name == "control"  # last in each round, after everything


def test_wrap_builds_each_command_line():
    cmd = ["sysbench", "threads", "run"]
    timeline = Path("/tmp/t.jsonl")
    assert by_name("baseline").wrap(cmd, GLEANER, None) == cmd
    assert by_name("gleaner").wrap(cmd, GLEANER, timeline) == [
        "/opt/gleaner", "run", "--timeline", "/tmp/t.jsonl", "--", *cmd]
    assert by_name("retention").wrap(cmd, GLEANER, None) == ["/opt/gleaner", "run", "--mode", "retention", "--", *cmd]
    assert by_name("consolidation").wrap(cmd, GLEANER, None)[3] == "consolidation"
    assert by_name("yield-loop").wrap(cmd, GLEANER, None)[3] == "always-yield"
    assert by_name("one-vcpu").wrap(cmd, GLEANER, None) == ["taskset", "-c", "0", *cmd]
    assert by_name("haltpoll").wrap(cmd, GLEANER, None) == cmd


def test_gleaner_config_needs_a_timeline_path():
    with pytest.raises(ValueError, match="timeline"):
        by_name("gleaner").wrap(["true"], GLEANER, None)
