#!/usr/bin/env python3
"""Kill test: SIGKILL gleaner at a random moment and check the workload is left exactly as
it was found, within 1 s, by the guard process alone.

Why: Gleaner changes which CPUs a production program may use. If it dies without running a
destructor (SIGKILL, OOM killer), its guard process must give everything back. This script
proves that on the real kernel, one random kill at a time.

Each iteration starts a real multithreaded workload (`gleaner workload pipeline`) either
under `gleaner run` (cgroup v1 cpuset on this machine) or under `gleaner attach PID`
(thread affinity), kills gleaner with SIGKILL after a random delay, and checks, polling for
at most 1 s:
  * gleaner and all its threads (including `gleaner-ret*` yielding threads) are gone,
    and so is its guard process;
  * the workload is alive (for `run`: if gleaner had started it; the workload's wrapper
    writes its pid to a file first thing, so a workload that started and died is a failure,
    not a kill "before the workload started");
  * every workload thread's allowed CPUs (Cpus_allowed_list) equal what they were before;
  * the workload is back in the cpuset/cpuacct cgroups it started in;
  * no `gleaner-<pid>` cgroup is left in the cpuset or cpuacct hierarchies;
  * the crash journal `<pid>.json` is gone from the state dir.
If something is left after 1 s, `gleaner recover` is run and the iteration is counted as a
failure (with the recovery result noted).

Usage: tests/kill_test.py [ITERATIONS] [--seed N] [--kind run|attach|both] [-v] [--log FILE]
--log FILE writes the run's record (machine, build, load, one line per iteration, summary).
Needs root and a cgroup v1 cpuset hierarchy (as on this project's test VM); otherwise it
prints why and exits 0 without testing (exit 77 with --strict).
"""

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gleaner_exe import gleaner_bin

CPUSET = Path("/sys/fs/cgroup/cpuset")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
DEADLINE_S = 1.0


def read(path, default=None):
    try:
        return Path(path).read_text()
    except OSError:
        return default


def allowed_list(pid, tid):
    text = read(f"/proc/{pid}/task/{tid}/status", "")
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


def v1_cgroups(pid):
    """{'cpuset': '/..', 'cpuacct': '/..'} from /proc/PID/cgroup."""
    out = {}
    for line in read(f"/proc/{pid}/cgroup", "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(","):
                if c in ("cpuset", "cpuacct"):
                    out[c] = parts[2]
    return out


def threads(pid):
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def alive(pid):
    stat = read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def tagged_processes(tag):
    """Pids whose environment carries our per-iteration tag (gleaner, guard, workload)."""
    pids = []
    needle = f"GLEANER_KILL_TEST_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(entry))
    return pids


def cmdline(pid):
    return read(f"/proc/{pid}/cmdline", "").split("\0")


def is_guard(pid):
    return "__guard" in cmdline(pid)


def kill_tree(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Iteration:
    def __init__(self, exe, kind, rng, state_dir, index):
        self.exe = exe
        self.kind = kind
        self.rng = rng
        self.state_dir = state_dir
        self.tag = f"{os.getpid()}-{index}-{rng.randrange(1 << 30)}"
        self.env = dict(os.environ, GLEANER_KILL_TEST_TAG=self.tag, GLEANER_LOG="warn")
        self.mode = rng.choice(["full", "always-yield", "consolidation"])
        # A third of the kills land in start-up (first 60 ms), the rest anywhere in 2 s.
        self.delay = rng.uniform(0, 0.06) if rng.random() < 0.33 else rng.uniform(0.06, 2.0)
        # In some `run` iterations the script shrinks the cgroup's cpuset itself right before
        # the kill, exactly as a Deactivate would, so restoring from a consolidated state is
        # exercised even where the policy does not consolidate on its own.
        self.simulate_consolidation = kind == "run" and rng.random() < 0.4
        self.workload_args = [exe, "workload", "pipeline", "--stages", "2", "--threads-per-stage", "2",
                              "--duration", "30"]
        self.flags = ["--state-dir", str(state_dir), "--period-ms", "20", "--retention-timeout-us", "50",
                      "--mode", self.mode]
        self.before = {}  # tid -> allowed list, attach only
        # `run` only: the workload's wrapper writes its pid here before exec'ing it, so the
        # check can tell a workload that died from one gleaner never started.
        self.pid_file = state_dir / f"workload-{self.tag}.pid"
        self.phase = "?"

    def start(self):
        devnull = subprocess.DEVNULL
        if self.kind == "run":
            self.own_allowed = allowed_list(os.getpid(), os.getpid())
            self.own_cgroups = v1_cgroups(os.getpid())
            wrapped = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.pid_file), *self.workload_args]
            self.gleaner = subprocess.Popen([self.exe, "run", *self.flags, "--", *wrapped],
                                            env=self.env, stdout=devnull, stderr=devnull)
            self.workload_pid = None
        else:
            self.workload = subprocess.Popen(self.workload_args, env=self.env, stdout=devnull, stderr=devnull)
            self.workload_pid = self.workload.pid
            time.sleep(0.15)  # let the pipeline start its threads
            tids = threads(self.workload_pid)
            # Make the masks differ between threads so "restored" means "restored exactly".
            if len(tids) > 1 and len(os.sched_getaffinity(0)) > 1:
                os.sched_setaffinity(tids[-1], {max(os.sched_getaffinity(0))})
            self.before = {t: allowed_list(self.workload_pid, t) for t in tids}
            self.own_allowed = self.before.get(self.workload_pid)
            self.own_cgroups = v1_cgroups(self.workload_pid)
            self.gleaner = subprocess.Popen([self.exe, "attach", *self.flags, str(self.workload_pid)],
                                            env=self.env, stdout=devnull, stderr=devnull)

    def started_workload(self):
        """The pid of the workload gleaner started (`run`), or None if it never started it."""
        try:
            return int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None

    def cgroup_dirs(self):
        name = f"gleaner-{self.gleaner.pid}"
        return [CPUSET / name, CPUACCT / name]

    def kill(self):
        time.sleep(self.delay)
        status_file = self.state_dir / f"{self.gleaner.pid}.status"
        cg = self.cgroup_dirs()[0]
        if self.gleaner.poll() is not None:
            self.phase = "exited-early"
        elif not status_file.exists():
            self.phase = "start-up"
        else:
            cpus = read(cg / "cpuset.cpus", "").strip()
            self.phase = "running"
            if self.simulate_consolidation and cpus and "-" in cpus:
                try:
                    (cg / "cpuset.cpus").write_text(cpus.split("-")[0])
                    self.phase = "consolidated(sim)"
                except OSError:
                    pass
            elif '"Rollback"' in read(status_file, "") or '"rollback"' in read(status_file, ""):
                self.phase = "after-rollback"
        # Gleaner's children now: its guard and (for `run`) the workload. Anything forked
        # after this read is still found by the full scan of tagged processes in check().
        kids = []
        for t in threads(self.gleaner.pid):
            kids += [int(k) for k in read(f"/proc/{self.gleaner.pid}/task/{t}/children", "").split()]
        self.gleaner.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
        self.known = kids
        # Not reaped until check() is done: the clock runs from the signal, and the guard
        # starts undoing as soon as the dying process has closed its files, before it is reaped.

    def problems(self, full_scan=True):
        """Everything still wrong now; empty when the workload is as it was. Without
        `full_scan` only the processes known at kill time are looked at (cheap enough to
        poll every few ms); with it, every process carrying this iteration's tag."""
        bad = []
        gp = self.gleaner.pid
        for t in threads(gp):
            stat = read(f"/proc/{gp}/task/{t}/stat", "")
            if stat and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                comm = read(f"/proc/{gp}/task/{t}/comm", "?").strip()
                kind = "yielding thread" if comm.startswith("gleaner-ret") else "gleaner thread"
                bad.append(f"{kind} {t} ({comm}) still running")
        procs = tagged_processes(self.tag) if full_scan else [p for p in self.known if alive(p)]
        procs = [p for p in procs if p != gp]
        guards = [p for p in procs if is_guard(p) and alive(p)]
        if guards:
            bad.append(f"guard still running ({guards})")
        for p in procs:
            for t in threads(p):
                comm = read(f"/proc/{p}/task/{t}/comm", "").strip()
                if comm.startswith("gleaner-ret"):
                    bad.append(f"yielding thread {t} ({comm}) remains")
        if self.kind == "run":
            workload = [p for p in procs if not is_guard(p) and alive(p)]
            started = self.started_workload()
            if started is not None and not alive(started):
                bad.append(f"workload died (pid {started})")
            elif started is not None and started not in workload:
                workload.append(started)  # started after the kill-time list of children
        else:
            workload = [self.workload_pid] if alive(self.workload_pid) else []
            if not workload:
                bad.append("workload died")
        for pid in workload:
            for tid in threads(pid):
                want = self.before.get(tid, self.own_allowed)
                got = allowed_list(pid, tid)
                if got is not None and got != want:
                    bad.append(f"thread {tid} allowed CPUs {got}, was {want}")
            cgs = v1_cgroups(pid)
            if cgs and cgs != self.own_cgroups:
                bad.append(f"pid {pid} in cgroups {cgs}, was {self.own_cgroups}")
        for d in self.cgroup_dirs():
            if d.exists():
                bad.append(f"{d} left behind")
        if (self.state_dir / f"{self.gleaner.pid}.json").exists():
            bad.append("journal left behind")
        return bad, workload

    def check(self):
        """(problems, workload pids, seconds from SIGKILL until a poll found all clean)."""
        while True:
            bad, _ = self.problems(full_scan=False)
            elapsed = time.monotonic() - self.killed_at  # an upper bound: measured after the poll
            if not bad or elapsed > DEADLINE_S:
                break
            time.sleep(0.005)
        if elapsed > DEADLINE_S:
            bad = [f"not restored within {DEADLINE_S} s: {b}" for b in bad]
        full, workload = self.problems(full_scan=True)
        self.gleaner.wait()
        return sorted(set(bad + full)), workload, elapsed

    def cleanup(self):
        pids = [p for p in tagged_processes(self.tag)]
        kill_tree(pids)
        if self.kind == "attach":
            self.workload.wait()
        deadline = time.monotonic() + 2
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.01)


def environment_problem():
    if os.geteuid() != 0:
        return "not root"
    if not (CPUSET / "cpuset.cpus").exists():
        return f"no cgroup v1 cpuset hierarchy at {CPUSET}"
    return None


class Report:
    """Prints to stdout and, with --log, records every line (and every iteration) in a file."""

    def __init__(self, log_path, verbose):
        self.verbose = verbose
        self.log = open(log_path, "w", buffering=1) if log_path else None

    def say(self, line, quiet=False):
        """`quiet` lines go to stdout only with -v; the log gets every line."""
        if self.verbose or not quiet:
            print(line, flush=True)
        if self.log:
            self.log.write(line + "\n")

    def close(self):
        if self.log:
            self.log.close()


def machine_lines(exe):
    """What a reader of a saved log needs to judge it: build, kernel, CPUs, idle driver."""
    def first_line(cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
            return out.splitlines()[0] if out else "?"
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    repo = Path(__file__).resolve().parent.parent
    commit = first_line(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"])
    dirty = first_line(["git", "-C", str(repo), "status", "--porcelain", "--", "crates", "Cargo.lock"])
    driver = (read("/sys/devices/system/cpu/cpuidle/current_driver", "?") or "?").strip()
    return [
        f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"gleaner: {exe} ({first_line([exe, '--version'])}; tree at commit {commit}"
        f"{', crates modified' if dirty != '?' else ''})",
        f"kernel: {os.uname().release}; CPUs {os.cpu_count()}; cpuidle driver {driver}",
        f"load average at start: {(read('/proc/loadavg', '?') or '?').split(' ')[:3]}",
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("iterations", nargs="?", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kind", choices=["run", "attach", "both"], default="both")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per iteration")
    ap.add_argument("--strict", action="store_true", help="exit 77 instead of 0 when the test cannot run here")
    ap.add_argument("--log", type=Path, help="write the full record (every iteration) to this file")
    args = ap.parse_args()
    why = environment_problem()
    if why:
        print(f"kill_test: skipped: {why}")
        return 77 if args.strict else 0
    exe = gleaner_bin("kill_test")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    kinds = ["run", "attach"] if args.kind == "both" else [args.kind]
    report = Report(args.log, args.verbose)
    report.say(f"kill_test: {args.iterations} iterations, seed {seed}, gleaner {exe}")
    for line in machine_lines(exe):
        report.say(line, quiet=True)
    state_dir = Path(tempfile.mkdtemp(prefix="gleaner-kill-test-"))
    passed, failures, phases, times = 0, [], {}, []
    try:
        for i in range(args.iterations):
            it = Iteration(exe, kinds[i % len(kinds)], rng, state_dir, i)
            it.start()
            it.kill()
            bad, workload, elapsed = it.check()
            key = f"{it.kind}/{it.phase}"
            phases[key] = phases.get(key, 0) + 1
            if bad:
                rec = subprocess.run([exe, "recover", "--state-dir", str(state_dir)], capture_output=True, text=True)
                after, _ = it.problems()
                failures.append((i, it.kind, it.mode, round(it.delay, 3), it.phase, bad, after, rec.stdout.strip()))
                report.say(f"  [{i}] FAIL {it.kind} mode={it.mode} delay={it.delay:.3f}s phase={it.phase}: {bad}; "
                           f"after `gleaner recover`: {after or 'clean'}")
            else:
                passed += 1
                times.append(elapsed)
                report.say(f"  [{i}] ok {it.kind} mode={it.mode} delay={it.delay:.3f}s phase={it.phase} "
                           f"restored in {elapsed * 1000:.0f} ms", quiet=True)
                # A dead workload is a failure above, so none alive here means never started.
                if not workload and it.kind == "run":
                    phases["run/killed-before-workload-started"] = phases.get("run/killed-before-workload-started", 0) + 1
            it.cleanup()
    finally:
        leftovers = list(state_dir.glob("*.json"))
        if leftovers:
            subprocess.run([exe, "recover", "--state-dir", str(state_dir)])
        shutil.rmtree(state_dir, ignore_errors=True)
    times.sort()
    report.say(f"load average at end: {(read('/proc/loadavg', '?') or '?').split(' ')[:3]}", quiet=True)
    if times:
        report.say(f"restore time after SIGKILL (ms): median {times[len(times) // 2] * 1000:.0f}, "
                   f"p95 {times[int(len(times) * 0.95)] * 1000:.0f}, max {times[-1] * 1000:.0f}")
    report.say(f"kill_test: {passed}/{args.iterations} passed (seed {seed})")
    report.say("kill moments: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    report.close()
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
