"""The pure part of quiet_start.py: what a run's timeline says."""

import json

import quiet_start


def test_timeline_facts_time_the_first_packing_from_the_turn_and_skip_edge_periods(tmp_path):
    def line(t, util, g, active="0-1", events=()):
        return {"t_s": t, "active": active, "events": list(events),
                "characteristics": {"total_util": util, "g_comp_ns": g}}

    lines = [
        line(0.1, 0.0, 0.0),
        line(0.3, 0.01, 5e6),  # quiet: before the turn, not a busy period
        line(0.45, 0.6, 9e4),  # the first busy period (it straddles the turn): left out
        line(0.55, 0.9, 8.6e7),  # a grain taken from the wrong window
        line(0.65, 0.9, 3e4, events=[{"kind": "deactivate", "cpu": 1}]),
        line(0.75, 0.9, 2e4, active="0"),
        line(0.85, 0.7, 4e8, active="0"),  # the last period (the program ends in it): left out
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(l) for l in lines) + "\nnot json\n")
    facts = quiet_start.timeline_facts(path, sleep_s=0.4)
    assert abs(facts["first_pack_s"] - 0.25) < 1e-9
    assert facts["max_busy_g_comp_ns"] == 8.6e7
    assert facts["packed_at_end"] is True
    assert facts["events"] == {"deactivate": 1}


def test_a_run_that_never_packs_says_so(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"t_s": 0.5, "active": "0-1", "events": [],
                                "characteristics": {"total_util": 0.9, "g_comp_ns": 1e4}}) + "\n")
    facts = quiet_start.timeline_facts(path, sleep_s=0.4)
    assert facts["first_pack_s"] is None and facts["packed_at_end"] is False
    assert facts["max_busy_g_comp_ns"] is None
