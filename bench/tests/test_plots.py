"""Latency-series extraction from the probe's JSON shape, and that each plot renders."""

import pytest

pytest.importorskip("matplotlib")

from harness import plots, report  # noqa: E402

# The shape of `gleaner probe --json` (gleaner-linux wakeprobe::ProbeReport), abridged.
PROBE = {
    "machine": {"kernel": "6.18", "vcpus": 2, "haltpoll_params": {"guest_halt_poll_ns": "200000"}},
    "points": [
        {"setting": "same_vcpu", "gap_ns": 50000,
         "latency": {"count": 100, "min_ns": 900, "p50_ns": 1500, "p90_ns": 2000, "p99_ns": 5000,
                     "max_ns": 9000, "mean_ns": 1700},
         "blocked_mean_ns": 0, "not_blocked": 0},
        {"setting": "halted", "gap_ns": 50000,
         "latency": {"count": 100, "min_ns": 9000, "p50_ns": 30000, "p90_ns": 45000, "p99_ns": 90000,
                     "max_ns": 120000, "mean_ns": 33000}},
    ],
    "derived_timeout": {"gap_ns": 50000, "timeout": {"ns": 28500}},
    "duration_ms": 1200,
}


@pytest.mark.parametrize("key, quantile", [
    ("p50_ns", 0.5), ("p99", 0.99), ("p99_9", 0.999), ("min_ns", 0.0), ("max", 1.0),
    ("mean_ns", None), ("gap_ns", None), ("p0", None), ("count", None),
])
def test_quantile_of(key, quantile):
    assert plots.quantile_of(key) == (quantile if quantile is None else pytest.approx(quantile))


def test_latency_series_one_per_probe_point():
    series = dict(plots.latency_series(PROBE))
    assert set(series) == {"same_vcpu gap 50us", "halted gap 50us"}
    assert series["halted gap 50us"] == [
        (9000.0, 0.0), (30000.0, 0.5), (45000.0, 0.9), (90000.0, 0.99), (120000.0, 1.0)]


def test_raw_samples_become_an_empirical_cdf():
    series = dict(plots.latency_series({"samples_ns": [30, 10, 20, 40]}))
    assert series["samples_ns"] == [(10.0, 0.25), (20.0, 0.5), (30.0, 0.75), (40.0, 1.0)]


def test_all_plots_render(tmp_path):
    workload = {"name": "w", "higher_is_better": True, "error": None, "runs": [
        {"config": "baseline", "rep": 0, "ok": True, "value": 10.0, "idle_per_s": {"0": 100.0}},
        {"config": "gleaner", "rep": 0, "ok": True, "value": 12.0, "idle_per_s": {"0": 10.0}},
    ]}
    workload["summary"] = report.summarise_workload(workload, ["baseline", "gleaner"])
    results = {"suite": "quick", "idle_source": "timer_list", "workloads": [workload],
               "configs": [{"name": "baseline", "status": "ran"}, {"name": "gleaner", "status": "ran"}]}
    timeline = [{"t_s": 0.5 * i, "n_active": 2 if i < 10 else 1, "active": "0-1"} for i in range(20)]
    written = [
        plots.speedup_bars(results, tmp_path / "s.png"),
        plots.idle_vs_speedup(results, tmp_path / "i.png"),
        plots.latency_cdf(PROBE, tmp_path / "l.png"),
        plots.active_timeline(timeline, [("fine", 5.0), ("coarse", 5.0)], tmp_path / "t.png"),
    ]
    for path in written:
        assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_to_plot_returns_none(tmp_path):
    assert plots.latency_cdf({"error": "x"}, tmp_path / "l.png") is None
    assert plots.active_timeline([], [], tmp_path / "t.png") is None
    assert not (tmp_path / "l.png").exists()
