"""Configuration selection, command wrapping and the interleaved run order."""

from pathlib import Path

import pytest

from harness.configs import CONFIGS, balanced_orders, interleave, select_configs

GLEANER = Path("/opt/gleaner")


def by_name(name):
    return next(config for config in CONFIGS if config.name == name)


def test_interleave_runs_every_config_once_per_round_in_a_balanced_order():
    order = interleave(["A", "B", "C"], 2)
    assert order == [(0, "A"), (0, "B"), (0, "C"), (1, "B"), (1, "C"), (1, "A")]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_balanced_orders_balance_positions_and_neighbours_over_a_cycle(n):
    cycle = n if n % 2 == 0 else 2 * n
    rows = balanced_orders(n, cycle)
    for row in rows:
        assert sorted(row) == list(range(n))
    for position in range(n):
        counts = [sum(row[position] == i for row in rows) for i in range(n)]
        assert len(set(counts)) == 1, f"position {position}: {counts}"
    follows = {}
    for row in rows:
        for a, b in zip(row, row[1:]):
            follows[(a, b)] = follows.get((a, b), 0) + 1
    if n > 1:
        # Every ordered pair of distinct indices is neighbours equally often.
        assert len(follows) == n * (n - 1)
        assert len(set(follows.values())) == 1
    # Past a cycle the orders repeat.
    assert balanced_orders(n, 2 * cycle)[cycle:] == rows


def test_gleaner_does_not_always_follow_baseline():
    names = [c.name for c in CONFIGS if c.name in ("baseline", "gleaner", "yield-loop", "one-vcpu", "haltpoll", "control")]
    order = [config for _, config in interleave(names, 6)]
    after_baseline = {order[i + 1] for i in range(len(order) - 1) if order[i] == "baseline" and (i + 1) % 6}
    assert len(after_baseline) > 1, after_baseline


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
    assert select_configs(None)[-1].name == "control"


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
