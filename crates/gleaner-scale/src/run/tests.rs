use super::*;

fn runner() -> Runner {
    Runner::new(SystemRoots::default(), CounterPlan::probe(), false)
}

fn command(words: &[&str]) -> PreparedCommand {
    PreparedCommand::new(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>()).unwrap()
}

/// An idle counter with no source (its roots do not exist).
fn no_idle_counter(cpu: usize) -> IdleCounter {
    let missing = std::path::PathBuf::from("/nonexistent-gleaner-test-root");
    IdleCounter::open(
        &SystemRoots {
            sys: missing.clone(),
            proc: missing,
        },
        &[cpu],
    )
}

#[test]
fn idle_entries_are_counted_over_the_run_window() {
    // A fake cpuidle tree whose counter the child itself advances from 10 to 50.
    let dir = tempfile::tempdir().unwrap();
    let cpu = crate::system::allowed_cpus().unwrap()[0];
    let state = dir
        .path()
        .join(format!("devices/system/cpu/cpu{cpu}/cpuidle/state0"));
    std::fs::create_dir_all(&state).unwrap();
    let usage = state.join("usage");
    std::fs::write(&usage, "10\n").unwrap();
    std::fs::write(state.join("time"), "1000\n").unwrap();
    let roots = SystemRoots {
        sys: dir.path().to_path_buf(),
        proc: "/proc".into(),
    };
    let mut idle = IdleCounter::open(&roots, &[cpu]);
    let script = format!("echo 50 > '{}'", usage.display());
    let measurement = runner()
        .measure(&command(&["sh", "-c", &script]), &[cpu], &mut idle)
        .unwrap();
    assert!(measurement.exit_status.success());
    assert_eq!(measurement.idle_entries, Some(40));
}

#[test]
fn resolves_programs_like_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool");
    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let not_executable = dir.path().join("data");
    std::fs::write(&not_executable, "").unwrap();

    let path_var = std::ffi::OsString::from(format!("/nonexistent:{}", dir.path().display()));
    assert_eq!(resolve_program("tool", Some(&path_var)), Some(tool.clone()));
    assert_eq!(resolve_program(tool.to_str().unwrap(), None), Some(tool));
    assert_eq!(resolve_program("data", Some(&path_var)), None);
    assert_eq!(resolve_program("missing", Some(&path_var)), None);
    assert_eq!(resolve_program("", Some(&path_var)), None);
}

#[test]
fn missing_program_is_a_one_line_error() {
    let err = PreparedCommand::new(&["definitely-not-a-program-xyz".to_string()]).unwrap_err();
    assert!(matches!(err, ScaleError::CommandNotFound { .. }));
    assert!(!err.to_string().contains('\n'));
    assert!(matches!(
        PreparedCommand::new(&[]).unwrap_err(),
        ScaleError::MissingCommand
    ));
}

#[test]
fn child_runs_on_the_requested_cpu_and_is_counted() {
    // The child prints its own allowed-CPU list; with stdout going to
    // /dev/null we check it through the exit status instead.
    let cpu = crate::system::allowed_cpus().unwrap()[0];
    let script = format!("grep -q '^Cpus_allowed_list:[[:space:]]*{cpu}$' /proc/self/status");
    let measurement = runner()
        .measure(
            &command(&["sh", "-c", &script]),
            &[cpu],
            &mut no_idle_counter(cpu),
        )
        .unwrap();
    assert!(
        measurement.exit_status.success(),
        "child was not restricted to CPU {cpu}"
    );
    assert!(measurement.wall_s > 0.0 && measurement.wall_s < 5.0);
    assert_eq!(measurement.idle_entries, None);
}

#[test]
fn failing_command_reports_its_status() {
    let cpu = crate::system::allowed_cpus().unwrap()[0];
    let measurement = runner()
        .measure(
            &command(&["sh", "-c", "exit 3"]),
            &[cpu],
            &mut no_idle_counter(cpu),
        )
        .unwrap();
    assert_eq!(measurement.exit_status.code(), Some(3));
}

#[test]
fn exec_failure_is_reported_not_hung() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("broken");
    // Executable bit but no valid interpreter: execv fails with ENOENT.
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cpu = crate::system::allowed_cpus().unwrap()[0];
    let err = runner()
        .measure(
            &command(&[script.to_str().unwrap()]),
            &[cpu],
            &mut no_idle_counter(cpu),
        )
        .unwrap_err();
    assert!(matches!(err, ScaleError::Exec { .. }), "{err}");
}

#[test]
fn software_counters_see_the_childs_threads() {
    let plan = CounterPlan::probe();
    if !plan.software.contains(&SoftwareEvent::TaskClock) {
        eprintln!(
            "skipping: software perf events unavailable: {:?}",
            plan.notes
        );
        return;
    }
    let cpu = crate::system::allowed_cpus().unwrap()[0];
    // A subshell pipeline: the counted work happens in grandchildren.
    let measurement = Runner::new(SystemRoots::default(), plan, false)
        .measure(
            &command(&[
                "sh",
                "-c",
                "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done | cat",
            ]),
            &[cpu],
            &mut no_idle_counter(cpu),
        )
        .unwrap();
    let task_clock_s = measurement.software[&SoftwareEvent::TaskClock] as f64 / 1e9;
    assert!(task_clock_s > 0.0);
    // Task clock and rusage CPU time describe the same work.
    assert!(
        task_clock_s <= measurement.wall_s * 1.5 + 0.01,
        "{measurement:?}"
    );
    assert!(measurement.software[&SoftwareEvent::ContextSwitches] >= 1);
}
