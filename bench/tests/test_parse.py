"""Metric extraction from captured tool reports, and timeline validation."""

import pytest

from harness import parse

# Captured on the dev guest with sysbench 1.0.20 / stress-ng 0.15.06.
SYSBENCH_THREADS = """sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)

General statistics:
    total time:                          1.0037s
    total number of events:              1097

Latency (ms):
         min:                                    0.69
"""

SYSBENCH_OLTP = """SQL statistics:
    queries performed:
        read:                            91812
    transactions:                        6558   (3273.84 per sec.)
    queries:                             131160 (65476.82 per sec.)

General statistics:
    total time:                          2.0021s
"""

STRESS_NG = """stress-ng: info:  [8626] dispatching hogs: 4 futex
stress-ng: metrc: [8626] stressor       bogo ops real time  usr time  sys time   bogo ops/s     bogo ops/s
stress-ng: metrc: [8626]                           (secs)    (secs)    (secs)   (real time) (usr+sys time)
stress-ng: metrc: [8626] futex            308375      1.00      0.29      1.70    308177.19      154619.20
stress-ng: info:  [8626] successful run completed in 1.00s"""


def test_sysbench_threads_events_per_second():
    assert parse.sysbench_events_per_s(SYSBENCH_THREADS) == pytest.approx(1097 / 1.0037)
    assert parse.sysbench_total_time(SYSBENCH_THREADS) == pytest.approx(1.0037)


def test_sysbench_oltp_transactions():
    assert parse.sysbench_transactions_per_s(SYSBENCH_OLTP) == pytest.approx(3273.84)


def test_stress_ng_picks_the_named_stressor_real_time_rate():
    assert parse.stress_ng_bogo_ops_per_s(STRESS_NG, "futex") == pytest.approx(308177.19)
    with pytest.raises(parse.ParseError, match="mutex"):
        parse.stress_ng_bogo_ops_per_s(STRESS_NG, "mutex")


def test_stress_ng_mutex_ignores_the_miscellaneous_metrics_line():
    text = (
        "stress-ng: metrc: [3557] mutex               673.12 nanosecs per mutex (geometic mean of 4 instances)\n"
        "stress-ng: metrc: [3557] mutex           1605799      1.11      0.57      3.14   1445919.29      432628.06\n"
    )
    assert parse.stress_ng_bogo_ops_per_s(text, "mutex") == pytest.approx(1445919.29)


def test_missing_line_is_a_parse_error():
    with pytest.raises(parse.ParseError, match="total time"):
        parse.sysbench_events_per_s("gleaner: started\n")


def test_last_json_object_skips_logs_and_reports_missing_keys():
    text = 'INFO gleaner: something\n{"not": "this"}\n{"workload":"pipeline","throughput_per_s":1234.5}\n'
    report = parse.last_json_object(text)
    assert parse.json_number(report, "throughput_per_s") == 1234.5
    with pytest.raises(parse.ParseError, match="keys: throughput_per_s, workload"):
        parse.json_number(report, "ops_per_s")
    with pytest.raises(parse.ParseError):
        parse.last_json_object("no json here\n{broken\n")
    wrapped = text + '{"gleaner": "summary", "periods": 12}\n'
    assert parse.last_json_object(wrapped, "throughput_per_s")["workload"] == "pipeline"
    with pytest.raises(parse.ParseError, match="with 'ops'"):
        parse.last_json_object(wrapped, "ops")


def test_read_timeline_and_compact(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"t_s":0.1,"active":"0-1","n_active":2,"rho":0.5}\n\n{"t_s":0.2,"active":"0","n_active":1}\n')
    rows = parse.read_timeline(path)
    assert [row["n_active"] for row in rows] == [2, 1]
    assert parse.compact_timeline(rows)[0] == {"t_s": 0.1, "active": "0-1", "n_active": 2}


def test_compact_timeline_keeps_holds_and_events(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"t_s":0.1,"active":"0-1","n_active":2,"retaining":[0,1],"events":[{"period":3,'
        '"kind":"retention-on","cpus":[0,1],"reason":"many idle periods"}],"rho":1.0}\n'
        '{"t_s":0.2,"active":"0","n_active":1,"retaining":[],"events":[{"period":4,"kind":"major-change","reason":"moved"}]}\n'
        '{"t_s":0.3,"active":"0","n_active":1,"retaining":[],"events":[]}\n'
        '{"t_s":0.4,"active":"0","n_active":1,"characteristics":{"total_util":0.99961,"g_comp_ns":20912.4,"l_comp_ns":5.0}}\n'
    )
    rows = parse.compact_timeline(parse.read_timeline(path))
    assert rows[0] == {
        "t_s": 0.1,
        "active": "0-1",
        "n_active": 2,
        "retaining": [0, 1],
        "events": ["retention-on cpus=[0, 1]: many idle periods"],
    }
    assert rows[1]["events"] == ["major-change: moved"] and "retaining" not in rows[1]
    assert rows[2] == {"t_s": 0.3, "active": "0", "n_active": 1}
    assert rows[3] == {"t_s": 0.4, "active": "0", "n_active": 1, "util": 1.0, "g_comp_us": 20.9}


@pytest.mark.parametrize("content, message", [("not json\n", "not JSON"), ('{"t_s": 1}\n', "expected an object")])
def test_read_timeline_rejects_bad_rows(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(parse.ParseError, match=message):
        parse.read_timeline(path)


def test_read_timeline_missing_file(tmp_path):
    with pytest.raises(parse.ParseError, match="cannot read timeline"):
        parse.read_timeline(tmp_path / "absent.jsonl")
