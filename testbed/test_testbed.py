"""Tests of the test bed driver (testbed/tbd/) that need neither QEMU nor a guest image.

Why they exist: the driver's arithmetic (paired speedups, weighted speedup), its parsing of
experiment files, /proc and agent lines, its lock and its cleanup decide whether a long QEMU
run is worth anything, so they are checked here in milliseconds. A fake "QEMU" (a Python
script speaking the guest agent's protocol) stands in for the real one.
Run: python3 -m pytest -q testbed   (from the repository root)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tbd import guest as tb_guest
from tbd import hostproc, lock, runner, summary
from tbd.errors import TestbedError as DriverError  # not "Test...": pytest would collect it
from tbd.experiment import GuestSpec, guest_command, load_experiment, parse_experiment, run_order
from tbd.guest import GuestSet, parse_result

ENTRY = Path(__file__).resolve().parent / "testbed.py"

FIG7 = Path(__file__).resolve().parent / "experiments" / "fig7.toml"

MINIMAL = """
name = "t"
[[case]]
name = "c"
  [[case.guest]]
  name = "bench"
  workload = "pipeline --stages 2"
  gleaner = "full"
  [[case.guest]]
  name = "co"
  workload = "matmul"
"""

# Speaks the guest agent's protocol: READY, then a fixed report per RUN; "hang" in the
# workload makes it ignore everything (to test that the driver kills it).
FAKE_QEMU = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, sys, time
    import os
    if os.environ.get("FAKE_QEMU_PIDS"):
        with open(os.environ["FAKE_QEMU_PIDS"], "a") as f:
            f.write("%d\\n" % os.getpid())
    print("boot noise", flush=True)
    print("TB-READY 2 fake", flush=True)
    for line in sys.stdin:
        if os.environ.get("FAKE_QEMU_INPUT"):
            with open(os.environ["FAKE_QEMU_INPUT"], "a") as f:
                f.write(line)
        words = line.split()
        if words and words[0] == "RUN":
            if "hang" in words:
                time.sleep(3600)
            if os.environ.get("FAKE_QEMU_BROKEN_GLEANER") and words[2] != "off":
                print("TB-RESULT %s 1 {}" % words[1], flush=True)
                print("TB-LOG %s gleaner: error: cannot start retention threads: ENOSYS" % words[1], flush=True)
                continue
            tput = 200.0 if words[2] == "full" else 100.0
            report = {"workload": words[3], "ops": 10, "elapsed_s": 0.1, "throughput_per_s": tput}
            print("TB-RESULT %s 0 %s" % (words[1], json.dumps(report)), flush=True)
        elif words and words[0] == "POWEROFF":
            break
    """
)


def record(case, rep, setting, bench_tput, co_tput, bench_rc=0):
    return {
        "case": case,
        "rep": rep,
        "setting": setting,
        "guests": {
            "bench": {"role": "benchmark", "rc": bench_rc, "report": {"throughput_per_s": bench_tput}},
            "co": {"role": "corunner", "rc": 0, "report": {"throughput_per_s": co_tput}},
        },
    }


# --------------------------------------------------------------------------- experiment files


def test_fig7_parses():
    exp = load_experiment(FIG7)
    assert [c.name for c in exp.cases] == ["pipeline", "barrier"]
    for case in exp.cases:
        assert [g.role for g in case.guests] == ["benchmark", "corunner"]
        assert [g.vcpus for g in case.guests] == [2, 2]


def test_every_shipped_experiment_parses():
    files = sorted(FIG7.parent.glob("*.toml"))
    assert len(files) >= 2
    for path in files:
        assert load_experiment(path).cases, path.name


def test_defaults_and_roles():
    exp = parse_experiment(MINIMAL, "m.toml")
    bench, co = exp.cases[0].guests
    assert (bench.role, co.role) == ("benchmark", "corunner")
    assert bench.workload == ["pipeline", "--stages", "2"]
    assert co.gleaner == "off"
    assert exp.repetitions == 3
    assert exp.pin_vcpus is False
    assert parse_experiment("pin_vcpus = true\n" + MINIMAL, "m.toml").pin_vcpus is True
    # The diagnostic mode that runs only Gleaner's guard beside the bare workload.
    guard = parse_experiment(MINIMAL.replace('gleaner = "full"', 'gleaner = "guard"'), "m.toml")
    assert guard.cases[0].guests[0].gleaner == "guard"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("not = [valid", "not valid TOML"),
        ('name = "x"', "no [[case]]"),
        (MINIMAL.replace('gleaner = "full"', 'gleaner = "turbo"'), "gleaner = 'turbo'"),
        (MINIMAL.replace("pipeline --stages 2", "pipeline --duration 3s"), "--duration"),
        (MINIMAL.replace('name = "co"', 'name = "co"\n  role = "benchmark"'), "exactly one guest"),
        (MINIMAL.replace('name = "co"', 'name = "bench"'), "distinct"),
        ("repetitions = 0\n" + MINIMAL, "repetitions"),
        (MINIMAL.replace('name = "co"', 'name = "co"\n  vcpu = 2'), "unknown key 'vcpu'"),
        (MINIMAL.replace('workload = "matmul"', 'workload = "matmul"\n  vcpus = 0'), "vcpus"),
        (MINIMAL.replace('gleaner = "full"', 'gleaner = "full"\n  gleaner_args = ["--period-ms 1000"]'), "gleaner_args"),
        (MINIMAL.replace('gleaner = "full"', 'gleaner = "full"\n  gleaner_args = ["period"]'), "gleaner_args"),
        (MINIMAL.replace('gleaner = "full"', 'gleaner = "off"\n  gleaner_args = ["--observe"]'), "need a gleaner mode"),
        ('pin_vcpus = "yes"\n' + MINIMAL, "pin_vcpus"),
    ],
)
def test_bad_files_are_refused_with_the_key(text, needle):
    with pytest.raises(DriverError) as err:
        parse_experiment(text, "bad.toml")
    assert needle in str(err.value)
    assert "bad.toml" in str(err.value)


# --------------------------------------------------------------------------- commands


def test_run_order_interleaves_and_alternates_first_setting():
    assert run_order(3) == [(0, "off"), (0, "on"), (1, "on"), (1, "off"), (2, "off"), (2, "on")]


def test_off_setting_runs_bare():
    spec = GuestSpec("b", "benchmark", 2, 256, ["barrier", "--work", "500"], "retention")
    assert guest_command(7, spec, "off", 20) == "RUN 7 off barrier --work 500 --duration 20s"
    assert guest_command(8, spec, "on", 1.5) == "RUN 8 retention barrier --work 500 --duration 1.5s"


def test_extra_gleaner_flags_ride_in_the_mode_word_of_the_on_setting_only():
    exp = parse_experiment(MINIMAL.replace('gleaner = "full"', 'gleaner = "observe"\n  gleaner_args = ["--period-ms=1000", "--backend=affinity"]'), "m.toml")
    spec = exp.cases[0].guests[0]
    assert spec.gleaner_args == ["--period-ms=1000", "--backend=affinity"]
    assert guest_command(3, spec, "on", 20) == "RUN 3 observe,--period-ms=1000,--backend=affinity pipeline --stages 2 --duration 20s"
    assert guest_command(4, spec, "off", 20) == "RUN 4 off pipeline --stages 2 --duration 20s"


def test_parse_result():
    assert parse_result('TB-RESULT 4 0 {"ops": 3}') == (4, 0, {"ops": 3})


@pytest.mark.parametrize("bad", ["TB-RESULT 4 0", "TB-RESULT x 0 {}", "TB-RESULT 4 0 {oops"])
def test_parse_result_refuses_malformed_lines(bad):
    with pytest.raises(DriverError):
        parse_result(bad)


# --------------------------------------------------------------------------- host /proc


def test_vcpu_threads_only_with_cpu_time_and_switches(tmp_path):
    root = tmp_path
    threads = {"101": ("qemu-system-x86", 50, 5), "102": ("CPU 0/TCG", 300, 100), "103": ("CPU 1/TCG", 200, 0)}
    for tid, (comm, utime, stime) in threads.items():
        d = root / "100" / "task" / tid
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        # A comm with ") (" inside must not shift the fields.
        fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 30
        (d / "stat").write_text(f"{tid} (a) (b) {' '.join(fields)}\n")
        (d / "status").write_text(
            f"Name:\t{comm}\nvoluntary_ctxt_switches:\t{utime}\nnonvoluntary_ctxt_switches:\t{stime}\n"
        )
    stats = hostproc.read_thread_stats(root, 100)
    assert sorted(stats) == ["CPU 0/TCG", "CPU 1/TCG"]
    tck = hostproc.CLK_TCK
    assert stats["CPU 0/TCG"].cpu_s == pytest.approx(400 / tck)
    assert stats["CPU 0/TCG"].voluntary_switches == 300
    assert stats["CPU 0/TCG"].involuntary_switches == 100
    assert hostproc.read_thread_stats(root, 999) == {}


def _fake_qemu_tasks(root: Path, pid: int, comms: dict[int, str]) -> None:
    for tid, comm in comms.items():
        d = root / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")


def test_vcpu_thread_ids_by_vcpu_index(tmp_path):
    _fake_qemu_tasks(tmp_path, 100, {101: "qemu-system-x86", 102: "CPU 1/TCG", 103: "CPU 0/TCG", 104: "CPU x/TCG"})
    assert hostproc.vcpu_thread_ids(tmp_path, 100) == {0: 103, 1: 102}
    assert hostproc.vcpu_thread_ids(tmp_path, 999) == {}


def test_pinning_puts_vcpu_i_of_every_guest_on_the_same_host_cpu(tmp_path):
    from types import SimpleNamespace

    _fake_qemu_tasks(tmp_path, 100, {101: "CPU 0/TCG", 102: "CPU 1/TCG", 103: "CPU 2/TCG"})
    _fake_qemu_tasks(tmp_path, 200, {201: "CPU 1/TCG", 202: "CPU 0/TCG", 209: "qemu-system-x86"})
    guests = [
        SimpleNamespace(proc=SimpleNamespace(pid=100), spec=GuestSpec("bench", "benchmark", 3, 256, ["pipeline"], "full")),
        SimpleNamespace(proc=SimpleNamespace(pid=200), spec=GuestSpec("co", "corunner", 2, 256, ["matmul"], "off")),
    ]
    calls = []
    pinned = runner.pin_vcpus(guests, [4, 6], tmp_path, lambda tid, cpus: calls.append((tid, cpus)))
    assert pinned == {"bench": {0: 4, 1: 6, 2: 4}, "co": {0: 4, 1: 6}}
    assert sorted(calls) == [(101, {4}), (102, {6}), (103, {4}), (201, {6}), (202, {4})]

    guests[1].spec.vcpus = 4  # QEMU shows fewer vCPU threads than the guest has
    with pytest.raises(DriverError, match="expected 0..3"):
        runner.pin_vcpus(guests, [0, 1], tmp_path, lambda tid, cpus: None)

    def refuse(tid, cpus):
        raise OSError(1, "Operation not permitted")

    with pytest.raises(DriverError, match="cannot pin guest bench's vCPU 0"):
        runner.pin_vcpus(guests[:1], [0], tmp_path, refuse)


def test_delta():
    before = {"CPU 0/TCG": hostproc.ThreadStats(1.0, 10, 2)}
    after = {"CPU 0/TCG": hostproc.ThreadStats(3.5, 15, 9), "CPU 1/TCG": hostproc.ThreadStats(1.0, 1, 1)}
    delta = hostproc.stats_delta(before, after)
    assert delta["CPU 0/TCG"] == {"cpu_s": 2.5, "voluntary_switches": 5, "involuntary_switches": 7}
    assert delta["CPU 1/TCG"]["cpu_s"] == 1.0


# --------------------------------------------------------------------------- summary


def test_paired_speedups_and_weighted_speedup():
    records = [
        record("c", 0, "off", 100, 50),
        record("c", 0, "on", 300, 40),  # bench 3.0, co 0.8 -> weighted 1.9
        record("c", 1, "on", 200, 50),
        record("c", 1, "off", 100, 50),  # bench 2.0, co 1.0 -> weighted 1.5
        record("c", 2, "off", 100, 50),
        record("c", 2, "on", 400, 25),  # bench 4.0, co 0.5 -> weighted 2.25
        record("c", 3, "off", 100, 50),  # interrupted: no "on"
        {**record("c", -1, "warmup", 1, 1)},
    ]
    s = summary.summarize(records, {"c": {"benchmark": "dedup"}})["c"]
    bench = s["speedup"]["bench"]
    assert {k: bench[k] for k in ("median", "min", "max", "n")} == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3}
    assert {k: s["speedup"]["co"][k] for k in ("median", "min", "max", "n")} == {"median": 0.8, "min": 0.5, "max": 1.0, "n": 3}
    # The median's bootstrap interval: inside the range, around the median, reproducible.
    for spread in (bench, s["speedup"]["co"], s["weighted_speedup"]):
        assert spread["min"] <= spread["low"] <= spread["median"] <= spread["high"] <= spread["max"]
    assert (bench["low"], bench["high"]) == (2.0, 4.0)  # three pairs: the median can be any of them
    assert summary.summarize(records)["c"]["speedup"]["bench"] == bench
    assert "| c | 3 | 3.00 [2.00, 4.00] | [2.00, 4.00] |" in summary.summary_markdown({"c": s}, {}, "t")
    assert s["weighted_speedup"]["median"] == pytest.approx(1.9)
    assert s["weighted_speedup"]["min"] == pytest.approx(1.5)
    assert s["weighted_speedup"]["max"] == pytest.approx(2.25)
    assert s["throughput_per_s"]["bench"]["off"]["n"] == 3
    assert s["paper"] == {"benchmark": "dedup"}


def test_pooled_batches_keep_their_pairs_apart(tmp_path):
    """Two batches both numbered from repetition 0: pooled, each pair stays within its batch
    (a 2.0 pair and a 4.0 pair, not an on of one batch over an off of the other)."""
    first, second = tmp_path / "a", tmp_path / "b"
    for d, on in ((first, 200), (second, 400)):
        d.mkdir()
        rows = [record("c", 0, "off", 100, 50), record("c", 0, "on", on, 50)]
        (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (first / "image-manifest.json").write_text(json.dumps({"git_commit": "abcdef1234567890"}))
    md = summary.pool_markdown([first, second])
    assert "Pooled over 2 batch(es): `a` (gleaner abcdef123456), `b` (gleaner ?)" in md
    assert "| c | 2 | 3.00 [2.00, 4.00] |" in md
    with pytest.raises(DriverError, match="named twice"):
        summary.pool_markdown([first, first])
    (second / "runs.jsonl").write_text("")
    with pytest.raises(DriverError, match="holds no runs"):
        summary.pool_markdown([first, second])


def test_failed_runs_are_left_out():
    records = [record("c", 0, "off", 100, 50), record("c", 0, "on", 0, 50, bench_rc=1)]
    s = summary.summarize(records)["c"]
    assert s["weighted_speedup"] is None
    assert s["speedup"] == {}
    md = summary.summary_markdown({"c": s}, {}, "t")
    assert "| c | 0 | n/a | - | n/a | n/a | - | - |" in md


def test_overlap_is_the_contended_fraction_of_the_benchmark_window():
    roles = {"b": "benchmark", "c": "corunner", "d": "corunner"}
    # Benchmark started 2 s late (gleaner calibrating): its last 2 s of 20 ran alone.
    windows = {"b": (2.0, 22.0), "c": (0.0, 20.0), "d": (0.0, 21.0)}
    assert runner.window_overlap(windows, roles) == pytest.approx(0.9)
    assert runner.window_overlap({"b": (0, 10), "c": (0, 10)}, roles) == pytest.approx(1.0)
    assert runner.window_overlap({"b": (0, 10), "c": (20, 30)}, roles) == pytest.approx(0.0)
    assert runner.window_overlap({"b": (0, 10)}, roles) is None


def test_vcpu_rates_in_the_summary():
    def with_threads(rec, cpu_s, switches, wall_s):
        rec["wall_s"] = wall_s
        rec["overlap"] = 1.0
        for g in rec["guests"].values():
            g["vcpu_threads"] = {
                "CPU 0/TCG": {"cpu_s": cpu_s, "voluntary_switches": switches, "involuntary_switches": 0},
                "CPU 1/TCG": {"cpu_s": cpu_s, "voluntary_switches": 0, "involuntary_switches": switches},
            }
        return rec

    records = [with_threads(record("c", 0, "off", 1, 1), 5.0, 1000, 10.0), with_threads(record("c", 0, "on", 2, 1), 8.0, 100, 10.0)]
    s = summary.summarize(records)["c"]
    assert s["vcpu_cpu_per_s"]["bench"]["off"]["median"] == 1.0
    assert s["vcpu_cpu_per_s"]["bench"]["on"]["median"] == 1.6
    assert s["vcpu_switches_per_s"]["co"]["off"]["median"] == 200.0
    assert s["vcpu_switches_per_s"]["co"]["on"]["median"] == 20.0
    assert s["window_overlap"]["on"]["median"] == 1.0
    assert "| c | bench | 1.00 [1.00, 1.00] | 2.00 [2.00, 2.00] | 1.00" in summary.summary_markdown({"c": s}, {}, "t")


# --------------------------------------------------------------------------- lock


def test_second_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "LOCK_PATH", tmp_path / "lock")
    with lock.RunLock():
        with pytest.raises(DriverError) as err:
            lock.RunLock().__enter__()
        assert str(os.getpid()) in str(err.value)
    with lock.RunLock():  # released on exit
        pass


# --------------------------------------------------------------------------- with a fake QEMU


@pytest.fixture
def image_dir(tmp_path, monkeypatch):
    """A fake image directory, with the fake QEMU as the driver's QEMU."""
    fake = tmp_path / "fake-qemu"
    fake.write_text(FAKE_QEMU)
    fake.chmod(0o755)
    monkeypatch.setattr(tb_guest, "QEMU", str(fake))
    for name in ("vmlinuz", "initramfs.cpio.gz"):
        (tmp_path / name).write_text("")
    (tmp_path / "manifest.json").write_text('{"image_sha256": "abc"}')
    return tmp_path


def test_experiment_end_to_end(image_dir):
    exp = parse_experiment("repetitions = 2\nduration_s = 1\n" + MINIMAL, "m.toml")
    out = image_dir / "results"
    runs = runner.run_experiment(exp, image_dir, out)
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [r["setting"] for r in records] == ["off", "on", "on", "off"]
    assert (out / "serial-c-bench.log").read_text().startswith("boot noise\nTB-READY")
    s = summary.summarize(records)["c"]
    assert s["speedup"]["bench"]["median"] == 2.0  # fake: full doubles throughput
    assert s["speedup"]["co"]["median"] == 1.0  # co-runner stays off
    assert s["weighted_speedup"]["median"] == 1.5
    assert all(0.0 <= r["overlap"] <= 1.0 for r in records)
    text = summary.write_summary(out, exp).read_text()
    assert text.startswith("# Test bed: t")
    assert "* c: not pinned" in text
    assert all(r["vcpu_pinning"] is None for r in records)


def test_pinned_runs_say_where_each_vcpu_ran():
    record = {"case": "c", "rep": 0, "vcpu_pinning": {"bench": {"0": 0, "1": 1}}, "wall_s": 1.0,
              "guests": {"bench": {"role": "benchmark", "rc": 0, "report": {"throughput_per_s": 1.0}}}}
    records = [dict(record, setting="off"), dict(record, setting="on")]
    s = summary.summarize(records)
    assert s["c"]["vcpu_pinning"] == {"bench": {"0": 0, "1": 1}}
    assert "* c: pinned (bench vCPU 0 on CPU 0, vCPU 1 on CPU 1)" in summary.summary_markdown(s, {}, "t")


def test_guests_are_killed_when_the_run_is_interrupted(image_dir):
    spec = GuestSpec("g", "benchmark", 2, 256, ["hang"], "off")
    with pytest.raises(KeyboardInterrupt):
        with GuestSet() as guests:
            guest = guests.start(spec, image_dir, image_dir / "serial.log")
            guest.expect("TB-READY", 10)
            guest.send(guest_command(1, spec, "off", 1))
            raise KeyboardInterrupt
    assert guest.proc.returncode is not None
    assert not Path(f"/proc/{guest.proc.pid}").exists()


def test_sigterm_to_the_driver_stops_every_guest(image_dir):
    exp = image_dir / "hang.toml"
    exp.write_text("duration_s = 1\n" + MINIMAL.replace("pipeline --stages 2", "hang"))
    pids = image_dir / "pids"
    env = {**os.environ, "GLEANER_TESTBED_QEMU": tb_guest.QEMU, "FAKE_QEMU_PIDS": str(pids),
           "GLEANER_TESTBED_LOCK": str(image_dir / "lock")}  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, str(ENTRY), "--image", str(image_dir), "run", str(exp), "--results", str(image_dir / "r")],
        env=env,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
        time.sleep(0.05)
    time.sleep(0.3)  # both guests booted and are running the hanging workload
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=10)
    assert driver.returncode == 130, err.decode()
    assert b"interrupted" in err
    for pid in pids.read_text().split():
        assert not Path(f"/proc/{pid}").exists(), f"fake QEMU {pid} survived"


def smoke(image_dir, **env) -> tuple[int, str]:
    """`testbed.py smoke` against the fake QEMU: (exit code, stderr)."""
    env = {**os.environ, "GLEANER_TESTBED_QEMU": tb_guest.QEMU, "GLEANER_TESTBED_LOCK": str(image_dir / "lock"),
           "FAKE_QEMU_INPUT": str(image_dir / "input"), "TMPDIR": str(image_dir), **env}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ENTRY), "--image", str(image_dir), "smoke"], env=env, capture_output=True, timeout=30
    )
    return done.returncode, done.stderr.decode()


def test_smoke_runs_the_workload_under_gleaner_with_retention(image_dir):
    rc, err = smoke(image_dir)
    assert rc == 0, err
    assert "testbed smoke: ok" in err
    runs = [line for line in (image_dir / "input").read_text().splitlines() if line.startswith("RUN")]
    assert runs == ["RUN 1 retention pipeline --duration 1s"]


def test_smoke_fails_when_gleaner_fails_in_the_guest(image_dir):
    rc, err = smoke(image_dir, FAKE_QEMU_BROKEN_GLEANER="1")
    assert rc == 1, err
    assert "testbed smoke: FAILED" in err
    assert "guest: gleaner: error: cannot start retention threads: ENOSYS" in err


def test_a_guest_that_never_answers_times_out(image_dir):
    spec = GuestSpec("g", "benchmark", 2, 256, ["hang"], "off")
    with pytest.raises(DriverError) as err:
        with GuestSet() as guests:
            guest = guests.start(spec, image_dir, image_dir / "serial.log")
            guest.send(guest_command(1, spec, "off", 1))
            guest.expect("TB-RESULT 1 ", 0.5)
    assert "no 'TB-RESULT 1 '" in str(err.value)
