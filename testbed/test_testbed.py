"""Tests of the test bed driver that need neither QEMU nor a guest image.

Why they exist: the driver's arithmetic (paired speedups, weighted speedup), its parsing of
experiment files, /proc and agent lines, its lock and its cleanup decide whether a long QEMU
run is worth anything, so they are checked here in milliseconds. A fake "QEMU" (a Python
script speaking the guest agent's protocol) stands in for the real one.
Run: python3 -m unittest testbed/test_testbed.py   (from the repository root)
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from unittest import mock

# Loaded by path: run from the repository root, the name "testbed" is this directory.
_spec = importlib.util.spec_from_file_location("testbed_driver", Path(__file__).resolve().parent / "testbed.py")
testbed = importlib.util.module_from_spec(_spec)
sys.modules["testbed_driver"] = testbed  # dataclasses look their module up by name
_spec.loader.exec_module(testbed)

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


class ExperimentFileTest(unittest.TestCase):
    def test_fig7_parses(self):
        exp = testbed.load_experiment(FIG7)
        self.assertEqual([c.name for c in exp.cases], ["pipeline", "barrier"])
        for case in exp.cases:
            self.assertEqual([g.role for g in case.guests], ["benchmark", "corunner"])
            self.assertEqual([g.vcpus for g in case.guests], [2, 2])

    def test_every_shipped_experiment_parses(self):
        files = sorted(FIG7.parent.glob("*.toml"))
        self.assertGreaterEqual(len(files), 2)
        for path in files:
            with self.subTest(path=path.name):
                self.assertTrue(testbed.load_experiment(path).cases)

    def test_defaults_and_roles(self):
        exp = testbed.parse_experiment(MINIMAL, "m.toml")
        bench, co = exp.cases[0].guests
        self.assertEqual((bench.role, co.role), ("benchmark", "corunner"))
        self.assertEqual(bench.workload, ["pipeline", "--stages", "2"])
        self.assertEqual(co.gleaner, "off")
        self.assertEqual(exp.repetitions, 3)

    def test_bad_files_are_refused_with_the_key(self):
        cases = {
            "not = [valid": "not valid TOML",
            'name = "x"': "no [[case]]",
            MINIMAL.replace('gleaner = "full"', 'gleaner = "turbo"'): "gleaner = 'turbo'",
            MINIMAL.replace("pipeline --stages 2", "pipeline --duration 3s"): "--duration",
            MINIMAL.replace('name = "co"', 'name = "co"\n  role = "benchmark"'): "exactly one guest",
            MINIMAL.replace('name = "co"', 'name = "bench"'): "distinct",
            "repetitions = 0\n" + MINIMAL: "repetitions",
            MINIMAL.replace('name = "co"', 'name = "co"\n  vcpu = 2'): "unknown key 'vcpu'",
            MINIMAL.replace('workload = "matmul"', 'workload = "matmul"\n  vcpus = 0'): "vcpus",
        }
        for text, needle in cases.items():
            with self.subTest(needle=needle):
                with self.assertRaises(testbed.TestbedError) as ctx:
                    testbed.parse_experiment(text, "bad.toml")
                self.assertIn(needle, str(ctx.exception))
                self.assertIn("bad.toml", str(ctx.exception))


class CommandTest(unittest.TestCase):
    def test_run_order_interleaves_and_alternates_first_setting(self):
        order = testbed.run_order(3)
        self.assertEqual(order, [(0, "off"), (0, "on"), (1, "on"), (1, "off"), (2, "off"), (2, "on")])

    def test_off_setting_runs_bare(self):
        spec = testbed.GuestSpec("b", "benchmark", 2, 256, ["barrier", "--work", "500"], "retention")
        self.assertEqual(testbed.guest_command(7, spec, "off", 20), "RUN 7 off barrier --work 500 --duration 20s")
        self.assertEqual(testbed.guest_command(8, spec, "on", 1.5), "RUN 8 retention barrier --work 500 --duration 1.5s")

    def test_parse_result(self):
        self.assertEqual(testbed.parse_result('TB-RESULT 4 0 {"ops": 3}'), (4, 0, {"ops": 3}))
        for bad in ("TB-RESULT 4 0", "TB-RESULT x 0 {}", "TB-RESULT 4 0 {oops"):
            with self.subTest(bad=bad), self.assertRaises(testbed.TestbedError):
                testbed.parse_result(bad)


class ProcTest(unittest.TestCase):
    def test_vcpu_threads_only_with_cpu_time_and_switches(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
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
            stats = testbed.read_thread_stats(root, 100)
            self.assertEqual(sorted(stats), ["CPU 0/TCG", "CPU 1/TCG"])
            tck = testbed.CLK_TCK
            self.assertAlmostEqual(stats["CPU 0/TCG"].cpu_s, 400 / tck)
            self.assertEqual(stats["CPU 0/TCG"].voluntary_switches, 300)
            self.assertEqual(stats["CPU 0/TCG"].involuntary_switches, 100)
            self.assertEqual(testbed.read_thread_stats(root, 999), {})

    def test_delta(self):
        before = {"CPU 0/TCG": testbed.ThreadStats(1.0, 10, 2)}
        after = {"CPU 0/TCG": testbed.ThreadStats(3.5, 15, 9), "CPU 1/TCG": testbed.ThreadStats(1.0, 1, 1)}
        delta = testbed.stats_delta(before, after)
        self.assertEqual(delta["CPU 0/TCG"], {"cpu_s": 2.5, "voluntary_switches": 5, "involuntary_switches": 7})
        self.assertEqual(delta["CPU 1/TCG"]["cpu_s"], 1.0)


class SummaryTest(unittest.TestCase):
    def test_paired_speedups_and_weighted_speedup(self):
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
        s = testbed.summarize(records, {"c": {"benchmark": "dedup"}})["c"]
        self.assertEqual(s["speedup"]["bench"], {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3})
        self.assertEqual(s["speedup"]["co"], {"median": 0.8, "min": 0.5, "max": 1.0, "n": 3})
        self.assertAlmostEqual(s["weighted_speedup"]["median"], 1.9)
        self.assertAlmostEqual(s["weighted_speedup"]["min"], 1.5)
        self.assertAlmostEqual(s["weighted_speedup"]["max"], 2.25)
        self.assertEqual(s["throughput_per_s"]["bench"]["off"]["n"], 3)
        self.assertEqual(s["paper"], {"benchmark": "dedup"})

    def test_failed_runs_are_left_out(self):
        records = [record("c", 0, "off", 100, 50), record("c", 0, "on", 0, 50, bench_rc=1)]
        s = testbed.summarize(records)["c"]
        self.assertIsNone(s["weighted_speedup"])
        self.assertEqual(s["speedup"], {})
        md = testbed.summary_markdown({"c": s}, {}, "t")
        self.assertIn("| c | n/a | n/a | n/a | - |", md)


class WindowTest(unittest.TestCase):
    def test_overlap_is_the_contended_fraction_of_the_benchmark_window(self):
        roles = {"b": "benchmark", "c": "corunner", "d": "corunner"}
        # Benchmark started 2 s late (gleaner calibrating): its last 2 s of 20 ran alone.
        windows = {"b": (2.0, 22.0), "c": (0.0, 20.0), "d": (0.0, 21.0)}
        self.assertAlmostEqual(testbed.window_overlap(windows, roles), 0.9)
        self.assertAlmostEqual(testbed.window_overlap({"b": (0, 10), "c": (0, 10)}, roles), 1.0)
        self.assertAlmostEqual(testbed.window_overlap({"b": (0, 10), "c": (20, 30)}, roles), 0.0)
        self.assertIsNone(testbed.window_overlap({"b": (0, 10)}, roles))

    def test_vcpu_rates_in_the_summary(self):
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
        s = testbed.summarize(records)["c"]
        self.assertEqual(s["vcpu_cpu_per_s"]["bench"]["off"]["median"], 1.0)
        self.assertEqual(s["vcpu_cpu_per_s"]["bench"]["on"]["median"], 1.6)
        self.assertEqual(s["vcpu_switches_per_s"]["co"]["off"]["median"], 200.0)
        self.assertEqual(s["vcpu_switches_per_s"]["co"]["on"]["median"], 20.0)
        self.assertEqual(s["window_overlap"]["on"]["median"], 1.0)
        self.assertIn("| c | bench | 1.00 [1.00, 1.00] | 2.00 [2.00, 2.00] | 1.00", testbed.summary_markdown({"c": s}, {}, "t"))


class LockTest(unittest.TestCase):
    def test_second_run_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(testbed, "LOCK_PATH", Path(tmp) / "lock"):
            with testbed.RunLock():
                with self.assertRaises(testbed.TestbedError) as ctx:
                    testbed.RunLock().__enter__()
                self.assertIn(str(os.getpid()), str(ctx.exception))
            with testbed.RunLock():  # released on exit
                pass


class FakeQemuTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        fake = self.dir / "fake-qemu"
        fake.write_text(FAKE_QEMU)
        fake.chmod(0o755)
        patcher = mock.patch.object(testbed, "QEMU", str(fake))
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(self.tmp.cleanup)
        for name in ("vmlinuz", "initramfs.cpio.gz"):
            (self.dir / name).write_text("")
        (self.dir / "manifest.json").write_text('{"image_sha256": "abc"}')

    def test_experiment_end_to_end(self):
        exp = testbed.parse_experiment("repetitions = 2\nduration_s = 1\n" + MINIMAL, "m.toml")
        out = self.dir / "results"
        runs = testbed.run_experiment(exp, self.dir, out)
        records = [json.loads(line) for line in runs.read_text().splitlines()]
        self.assertEqual([r["setting"] for r in records], ["off", "on", "on", "off"])
        self.assertTrue((out / "serial-c-bench.log").read_text().startswith("boot noise\nTB-READY"))
        s = testbed.summarize(records)["c"]
        self.assertEqual(s["speedup"]["bench"]["median"], 2.0)  # fake: full doubles throughput
        self.assertEqual(s["speedup"]["co"]["median"], 1.0)  # co-runner stays off
        self.assertEqual(s["weighted_speedup"]["median"], 1.5)
        self.assertTrue(all(0.0 <= r["overlap"] <= 1.0 for r in records))
        self.assertTrue(testbed.write_summary(out, exp).read_text().startswith("# Test bed: t"))

    def test_guests_are_killed_when_the_run_is_interrupted(self):
        spec = testbed.GuestSpec("g", "benchmark", 2, 256, ["hang"], "off")
        with self.assertRaises(KeyboardInterrupt):
            with testbed.GuestSet() as guests:
                guest = guests.start(spec, self.dir, self.dir / "serial.log")
                guest.expect("TB-READY", 10)
                guest.send(testbed.guest_command(1, spec, "off", 1))
                raise KeyboardInterrupt
        self.assertIsNotNone(guest.proc.returncode)
        self.assertFalse(Path(f"/proc/{guest.proc.pid}").exists())

    def test_sigterm_to_the_driver_stops_every_guest(self):
        exp = self.dir / "hang.toml"
        exp.write_text("duration_s = 1\n" + MINIMAL.replace("pipeline --stages 2", "hang"))
        pids = self.dir / "pids"
        env = {**os.environ, "GLEANER_TESTBED_QEMU": testbed.QEMU, "FAKE_QEMU_PIDS": str(pids),
               "GLEANER_TESTBED_LOCK": str(self.dir / "lock")}  # fmt: skip
        driver = subprocess.Popen(
            [sys.executable, testbed.__file__, "--image", str(self.dir), "run", str(exp), "--results", str(self.dir / "r")],
            env=env,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.05)
        time.sleep(0.3)  # both guests booted and are running the hanging workload
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=10)
        self.assertEqual(driver.returncode, 130, err.decode())
        self.assertIn(b"interrupted", err)
        for pid in pids.read_text().split():
            self.assertFalse(Path(f"/proc/{pid}").exists(), f"fake QEMU {pid} survived")

    def smoke(self, **env) -> tuple[int, str]:
        """`testbed.py smoke` against the fake QEMU: (exit code, stderr)."""
        env = {**os.environ, "GLEANER_TESTBED_QEMU": testbed.QEMU, "GLEANER_TESTBED_LOCK": str(self.dir / "lock"),
               "FAKE_QEMU_INPUT": str(self.dir / "input"), "TMPDIR": str(self.dir), **env}  # fmt: skip
        done = subprocess.run(
            [sys.executable, testbed.__file__, "--image", str(self.dir), "smoke"], env=env, capture_output=True, timeout=30
        )
        return done.returncode, done.stderr.decode()

    def test_smoke_runs_the_workload_under_gleaner_with_retention(self):
        rc, err = self.smoke()
        self.assertEqual(rc, 0, err)
        self.assertIn("testbed smoke: ok", err)
        runs = [line for line in (self.dir / "input").read_text().splitlines() if line.startswith("RUN")]
        self.assertEqual(runs, ["RUN 1 retention pipeline --duration 1s"])

    def test_smoke_fails_when_gleaner_fails_in_the_guest(self):
        rc, err = self.smoke(FAKE_QEMU_BROKEN_GLEANER="1")
        self.assertEqual(rc, 1, err)
        self.assertIn("testbed smoke: FAILED", err)
        self.assertIn("guest: gleaner: error: cannot start retention threads: ENOSYS", err)

    def test_a_guest_that_never_answers_times_out(self):
        spec = testbed.GuestSpec("g", "benchmark", 2, 256, ["hang"], "off")
        with self.assertRaises(testbed.TestbedError) as ctx:
            with testbed.GuestSet() as guests:
                guest = guests.start(spec, self.dir, self.dir / "serial.log")
                guest.send(testbed.guest_command(1, spec, "off", 1))
                guest.expect("TB-RESULT 1 ", 0.5)
        self.assertIn("no 'TB-RESULT 1 '", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
