use super::*;
use proptest::prelude::*;
use std::fs;

/// Sampled from this project's 2-vCPU Firecracker guest.
pub const STAT: &str = "cpu  9702 0 1190 71728 482 0 81 7 0 0
cpu0 4478 0 501 36502 63 0 44 4 0 0
cpu1 5224 0 689 35226 418 0 37 3 0 0
intr 159197 0 0 0 0 0 0 0
ctxt 263776
btime 1795416734
processes 6818
procs_running 1
procs_blocked 0
softirq 89693 0 10239 4 3960 31627 0 72 21209 0 22582
";

/// The layout of this guest's `/proc/timer_list`, trimmed to the parts we read.
pub const TIMER_LIST: &str = "Timer List Version: v0.10
HRTIMER_MAX_CLOCK_BASES: 8
now at 416539269679 nsecs

cpu: 0
 clock 0:
  .base:       000000007d3bd0ad
  .index:      0
active timers:
 #0: <000000000d487392>, tick_nohz_handler, S:01
 # expires at 416540000000-416540000000 nsecs [in 730321 to 730321 nsecs]
  .expires_next   : 416540000000 nsecs
  .nohz           : 1
  .idle_jiffies   : 4294996383
  .idle_calls     : 7063
  .idle_sleeps    : 4403
  .idle_entrytime : 416538856192 nsecs
  .idle_sleeptime : 366579232318 nsecs
  .iowait_sleeptime: 636760392 nsecs
jiffies: 4294996832

cpu: 1
 clock 0:
active timers:
  .idle_calls     : 5251
  .idle_sleeps    : 3003
  .idle_sleeptime : 353662878656 nsecs
  .iowait_sleeptime: 4243087387 nsecs
jiffies: 4294996832

Tick Device: mode:     1
Per CPU device: 0
Clock Event Device: lapic-deadline
";

const TASK_STAT: &str = "7185 (cat) R 7182 7182 4858 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 41988 3133440 406 18446744073709551615 94882161831936 94882161851817 140722090590192 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94882161867824 94882161869440 94882889904128 140722090592964 140722090592984 140722090592984 140722090594283 0\n";

const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nTgid:\t7184\nPid:\t7184\nPPid:\t7182\nThreads:\t1\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";

fn proc100(dir: &Path) -> ProcFs {
    ProcFs::with_clock_ticks(dir, 100)
}

#[test]
fn stat_converts_ticks_to_ns() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("stat"), STAT).unwrap();
    let s = proc100(dir.path()).stat().unwrap();
    assert_eq!(s.per_cpu.len(), 2);
    assert_eq!(s.per_cpu[1].cpu, 1);
    assert_eq!(s.per_cpu[1].times.user_ns, 52_240_000_000);
    assert_eq!(s.per_cpu[0].times.steal_ns, 40_000_000);
    assert_eq!(s.total.idle_ns, 717_280_000_000);
    assert_eq!(s.ctxt, 263_776);
    assert_eq!((s.procs_running, s.procs_blocked), (1, 0));
    assert_eq!(
        proc100(dir.path()).online_cpus().unwrap().to_string(),
        "0-1"
    );
}

#[test]
fn stat_rejects_truncated_cpu_line() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("stat"), "cpu  1 2 3\nctxt 1\n").unwrap();
    let err = proc100(dir.path()).stat().unwrap_err();
    assert!(matches!(err, Error::Parse { .. }), "{err}");
    assert!(err.to_string().contains("stat"), "{err}");
}

#[test]
fn timer_list_reads_per_cpu_idle() {
    let dir = tempfile::tempdir().unwrap();
    let p = proc100(dir.path());
    assert_eq!(p.timer_list().unwrap(), None, "absent file is None");
    fs::write(dir.path().join("timer_list"), TIMER_LIST).unwrap();
    let cpus = p.timer_list().unwrap().unwrap();
    assert_eq!(cpus.len(), 2);
    assert_eq!(
        cpus[0],
        TimerListCpu {
            cpu: 0,
            idle_calls: 7063,
            idle_sleeps: 4403,
            idle_sleeptime_ns: 366_579_232_318,
            iowait_sleeptime_ns: 636_760_392
        }
    );
    assert_eq!(cpus[1].idle_calls, 5251);
}

#[test]
fn timer_list_truncated_mid_cpu_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cut = &TIMER_LIST[..TIMER_LIST.find("  .idle_sleeps    : 3003").unwrap()];
    fs::write(dir.path().join("timer_list"), cut).unwrap();
    assert!(matches!(
        proc100(dir.path()).timer_list(),
        Err(Error::Parse { .. })
    ));
}

#[test]
fn pressure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpu.pressure");
    fs::write(
            &path,
            "some avg10=2.68 avg60=0.82 avg300=0.73 total=4992723\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
    let psi = read_pressure(&path).unwrap();
    assert_eq!(psi.some_total_us, 4_992_723);
    assert_eq!(psi.full_total_us, Some(0));
    assert!((psi.some_avg10 - 2.68).abs() < 1e-9);
    assert!(parse_pressure(Path::new("x"), "full total=3\n").is_err());
    fs::write(dir.path().join("loadavg"), "0.07 0.21 0.11 1/89 6822\n").unwrap();
    let la = proc100(dir.path()).loadavg().unwrap();
    assert_eq!((la.runnable, la.total_tasks), (1, 89));
}

#[test]
fn wake_interrupts_and_kernel_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = proc100(dir.path());
    assert_eq!(p.wake_interrupts().unwrap(), None, "absent file is None");
    let text = "           CPU0       CPU1\n  LOC:       6089       7079   Local timer interrupts\n  RES:       2907       5804   Rescheduling interrupts\n";
    fs::write(dir.path().join("interrupts"), text).unwrap();
    assert_eq!(p.wake_interrupts().unwrap(), Some(vec![2907, 5804]));
    // Function-call IPIs carry the wake-ups of idle CPUs since Linux 5.8: summed with RES.
    let text = format!("{text}  CAL:     132817     133134   Function call interrupts\n  TLB:  1  2   TLB shootdowns\n");
    fs::write(dir.path().join("interrupts"), text).unwrap();
    assert_eq!(p.wake_interrupts().unwrap(), Some(vec![135_724, 138_938]));
    // ARM64 names the rows by number; the legend says what they are.
    let arm = "           CPU0       CPU1\nIPI0:        10         20       Rescheduling interrupts\nIPI1:       300        400       Function call interrupts\nIPI2:         5          6       CPU stop interrupts\n";
    fs::write(dir.path().join("interrupts"), arm).unwrap();
    assert_eq!(p.wake_interrupts().unwrap(), Some(vec![310, 420]));
    // With CPU 1 offline, the second column is CPU 2's.
    let holes = "           CPU0       CPU2\n  RES:  7  9   Rescheduling interrupts\n";
    fs::write(dir.path().join("interrupts"), holes).unwrap();
    assert_eq!(p.wake_interrupts().unwrap(), Some(vec![7, 0, 9]));
    let extra = "           CPU0\n  RES:  7  9   Rescheduling interrupts\n";
    fs::write(dir.path().join("interrupts"), extra).unwrap();
    assert!(matches!(p.wake_interrupts(), Err(Error::Parse { .. })));
    fs::write(dir.path().join("interrupts"), "garbage").unwrap();
    assert_eq!(p.wake_interrupts().unwrap(), None);
    fs::write(dir.path().join("interrupts"), "RES: x y").unwrap();
    assert!(matches!(p.wake_interrupts(), Err(Error::Parse { .. })));

    fs::create_dir_all(dir.path().join("sys/kernel/random")).unwrap();
    fs::write(dir.path().join("sys/kernel/random/boot_id"), "1f0e-77\n").unwrap();
    fs::write(dir.path().join("sys/kernel/osrelease"), "\n").unwrap();
    assert_eq!(p.boot_id().unwrap(), "1f0e-77");
    assert!(matches!(p.kernel_release(), Err(Error::Parse { .. })));
    fs::write(dir.path().join("cpuinfo"), "processor : 0\n").unwrap();
    assert_eq!(p.hypervisor_flag().unwrap(), None);
    fs::write(
        dir.path().join("cpuinfo"),
        "flags\t: fpu hypervisor\nflags\t: fpu hypervisor\n",
    )
    .unwrap();
    assert_eq!(p.hypervisor_flag().unwrap(), Some(true));
    fs::write(dir.path().join("cpuinfo"), "flags\t: fpu vme\n").unwrap();
    assert_eq!(p.hypervisor_flag().unwrap(), Some(false));
}

#[test]
fn process_status_tells_a_dying_process() {
    let dir = tempfile::tempdir().unwrap();
    let p = proc100(dir.path());
    fs::create_dir_all(dir.path().join("9")).unwrap();
    let write =
        |extra: &str| fs::write(dir.path().join("9/status"), format!("{STATUS}{extra}")).unwrap();
    write("SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n");
    let st = p.process_status(9).unwrap();
    assert_eq!(
        (st.state, st.pending_signals, st.is_dying()),
        (Some('R'), 0, false)
    );
    write("ShdPnd:\t0000000000000100\n"); // signal 9
    assert!(p.process_status(9).unwrap().is_dying());
    write("SigPnd:\t0000000000004000\n"); // signal 15 only
    assert!(!p.process_status(9).unwrap().is_dying());
    fs::write(
        dir.path().join("9/status"),
        STATUS.replace("R (running)", "Z (zombie)"),
    )
    .unwrap();
    assert!(p.process_status(9).unwrap().is_dying());
    write("SigPnd:\tzz\n");
    assert!(matches!(p.process_status(9), Err(Error::Parse { .. })));
    assert!(p.process_status(10).unwrap_err().is_not_found());
}

#[test]
fn task_stat_handles_hostile_comm() {
    let p = ProcFs::with_clock_ticks("/nonexistent", 100);
    let text = TASK_STAT.replace("(cat)", "(a) b (c) 9 9)");
    let st = parse_task_stat(Path::new("s"), &text, &p).unwrap();
    assert_eq!(st.comm, "a) b (c) 9 9");
    assert_eq!((st.tid, st.state, st.ppid), (7185, 'R', 7182));
    assert_eq!((st.utime_ns, st.stime_ns), (2_500_000_000, 500_000_000));
    assert_eq!(
        (st.num_threads, st.start_ticks, st.processor),
        (1, 41988, 1)
    );
}

#[test]
fn task_status_and_cgroup_lines() {
    let st = parse_task_status(Path::new("s"), STATUS).unwrap();
    assert_eq!(st.tgid, 7184);
    assert_eq!(
        (st.voluntary_ctxt_switches, st.nonvoluntary_ctxt_switches),
        (12, 3)
    );
    assert_eq!(st.cpus_allowed.to_string(), "0-1");
    assert_eq!((st.state, st.pending_signals), (Some('R'), 0));
    let cg = parse_proc_cgroup(
            Path::new("c"),
            "9:name=systemd:/\n4:memory:/process_api/9a42\n3:cpuset:/gleaner-1\n2:cpu,cpuacct:/a:b\n0::/user.slice\n",
        )
        .unwrap();
    assert_eq!(cg.v2(), Some("/user.slice"));
    assert_eq!(cg.v1("cpuset"), Some("/gleaner-1"));
    assert_eq!(cg.v1("cpuacct"), Some("/a:b"));
    assert_eq!(cg.v1("pids"), None);
    assert!(parse_proc_cgroup(Path::new("c"), "garbage\n").is_err());
}

#[test]
fn mountinfo_finds_cgroup_mounts() {
    let text = "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n\
                    50 27 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n";
    let m = parse_mountinfo(Path::new("m"), text).unwrap();
    assert_eq!(m[0].super_options, vec!["rw", "cpuset"]);
    assert_eq!(m[1].fs_type, "cgroup2");
    assert_eq!(m[1].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
    assert_eq!(m[2].mount_point, PathBuf::from("/mnt/with space"));
    assert!(parse_mountinfo(Path::new("m"), "1 2 3\n").is_err());
}

fn fake_process(root: &Path, pid: u32, ppid: u32, threads: &[u32], children_file: Option<&[u32]>) {
    for &tid in threads {
        let dir = root.join(format!("{pid}/task/{tid}"));
        fs::create_dir_all(&dir).unwrap();
        let stat =
            TASK_STAT
                .replacen("7185", &tid.to_string(), 1)
                .replacen("7182", &ppid.to_string(), 1);
        fs::write(dir.join("stat"), &stat).unwrap();
        if tid == pid {
            fs::write(root.join(format!("{pid}/stat")), &stat).unwrap();
        }
        if let Some(kids) = children_file {
            let text: Vec<String> = if tid == pid {
                kids.iter().map(|k| k.to_string()).collect()
            } else {
                vec![]
            };
            fs::write(dir.join("children"), text.join(" ")).unwrap();
        }
    }
}

#[test]
fn process_tree_from_children_files() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    fake_process(r, 10, 1, &[10, 11], Some(&[20, 30]));
    fake_process(r, 20, 10, &[20], Some(&[40]));
    fake_process(r, 30, 10, &[30], Some(&[]));
    fake_process(r, 40, 20, &[40, 41, 42], Some(&[10])); // a bogus cycle back to the root
    let p = proc100(r);
    assert_eq!(p.threads(40).unwrap(), vec![40, 41, 42]);
    assert_eq!(p.process_tree(10).unwrap(), vec![10, 20, 30, 40]);
    assert_eq!(p.process_start_time(20).unwrap(), 41988);
    assert!(p.process_tree(99).unwrap_err().is_not_found());
}

#[test]
fn process_tree_by_ppid_scan_without_children_files() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    fake_process(r, 10, 1, &[10], None);
    fake_process(r, 20, 10, &[20], None);
    fake_process(r, 30, 20, &[30], None);
    fake_process(r, 50, 1, &[50], None);
    assert_eq!(proc100(r).process_tree(10).unwrap(), vec![10, 20, 30]);
}

#[test]
fn reads_this_machines_proc() {
    // The real /proc always has these for our own process; checks the parsers on live text.
    let p = ProcFs::new("/proc");
    let me = std::process::id();
    assert!(!p.stat().unwrap().per_cpu.is_empty());
    assert!(p.threads(me).unwrap().contains(&me));
    assert_eq!(p.task_status(me, me).unwrap().tgid, me);
    assert!(p.task_stat(me, me).unwrap().start_ticks > 0);
    assert!(!p.cgroup_of(me).unwrap().0.is_empty());
    assert!(!p.mountinfo().unwrap().is_empty());
    // Root-only; when readable it must parse and cover every online CPU.
    if let Some(idle) = p.timer_list().unwrap() {
        assert_eq!(idle.len(), p.online_cpus().unwrap().len());
    }
}

proptest! {
    #[test]
    fn parsers_never_panic(text in "(?s).{0,300}") {
        let p = ProcFs::with_clock_ticks("/x", 100);
        let path = Path::new("f");
        let _ = parse_stat(path, &text, &p);
        let _ = parse_timer_list(path, &text);
        let _ = parse_pressure(path, &text);
        let _ = parse_loadavg(path, &text);
        let _ = parse_task_stat(path, &text, &p);
        let _ = parse_task_status(path, &text);
        let _ = parse_wake_interrupts(path, &text);
        let _ = parse_proc_cgroup(path, &text);
        let _ = parse_mountinfo(path, &text);
    }

    #[test]
    fn truncated_real_samples_never_panic(cut in 0usize..600) {
        let p = ProcFs::with_clock_ticks("/x", 100);
        let path = Path::new("f");
        let _ = parse_stat(path, &STAT[..cut.min(STAT.len())], &p);
        let _ = parse_timer_list(path, &TIMER_LIST[..cut.min(TIMER_LIST.len())]);
        let _ = parse_task_stat(path, &TASK_STAT[..cut.min(TASK_STAT.len())], &p);
        let _ = parse_task_status(path, &STATUS[..cut.min(STATUS.len())]);
    }
}

#[test]
fn task_schedstat_reads_run_wait_and_timeslices() {
    let dir = tempfile::tempdir().unwrap();
    let p = proc100(dir.path());
    let task = dir.path().join("7/task/8");
    fs::create_dir_all(&task).unwrap();
    assert!(p.task_schedstat(7, 8).unwrap_err().is_not_found());
    fs::write(task.join("schedstat"), "163594545 8178418 513\n").unwrap();
    assert_eq!(
        p.task_schedstat(7, 8).unwrap(),
        TaskSchedstat {
            run_ns: 163_594_545,
            wait_ns: 8_178_418,
            timeslices: 513
        }
    );
    for bad in ["1 2\n", "1 x 3\n", ""] {
        fs::write(task.join("schedstat"), bad).unwrap();
        let err = p.task_schedstat(7, 8).unwrap_err();
        assert!(matches!(err, Error::Parse { .. }), "{bad:?}: {err}");
        assert!(err.to_string().contains("schedstat"), "{err}");
    }
}

#[test]
fn timer_list_stops_reading_at_the_tick_devices() {
    // What follows the tick devices is never parsed, however malformed.
    let dir = tempfile::tempdir().unwrap();
    let text = format!("{TIMER_LIST}cpu: x\n  .idle_calls : garbage\n");
    fs::write(dir.path().join("timer_list"), text).unwrap();
    let cpus = proc100(dir.path()).timer_list().unwrap().unwrap();
    assert_eq!(
        cpus.iter().map(|c| c.idle_calls).collect::<Vec<_>>(),
        [7063, 5251]
    );
}
