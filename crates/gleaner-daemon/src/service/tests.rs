use super::instances::tag_line;
use super::targets::{has_tasks, resolve_in};
use super::*;
use gleaner_linux::{Detection, PlacementKind};
use gleaner_policy::Mode;

const FULL: &str = r#"
period_ms = 200
[policy]
mode = "full"
rho = 0.8

[metrics]
listen = "127.0.0.1:9477"
textfile = "/var/lib/node_exporter/textfile/gleaner.prom"

[[target]]
unit = "mysql.service"
progress_file = "/run/mysqld/tx_count"

[[target]]
cgroup = "/sys/fs/cgroup/cpuset/batch"
name = "batch"
period_ms = 500
[target.policy]
eta = 0.5
"#;

#[test]
fn parses_targets_with_overrides_on_the_service_keys() {
    let cfg = parse(FULL).unwrap();
    assert_eq!(cfg.metrics.listen, Some("127.0.0.1:9477".parse().unwrap()));
    assert_eq!(
        cfg.metrics.textfile.as_deref(),
        Some(Path::new("/var/lib/node_exporter/textfile/gleaner.prom"))
    );
    assert_eq!(cfg.targets.len(), 2);
    let (db, batch) = (&cfg.targets[0], &cfg.targets[1]);
    assert_eq!(db.name, "mysql.service");
    assert_eq!(db.cgroup, CgroupRef::Unit("mysql.service".into()));
    // A progress counter belongs to the target whose program it counts.
    assert_eq!(
        db.daemon.progress_file.as_deref(),
        Some(Path::new("/run/mysqld/tx_count"))
    );
    assert_eq!(cfg.targets[1].daemon.progress_file, None);
    assert_eq!(
        (
            db.daemon.period_ms,
            db.daemon.policy.rho,
            db.daemon.policy.eta
        ),
        (200, 0.8, 1.0)
    );
    assert_eq!(
        batch.cgroup,
        CgroupRef::Path("/sys/fs/cgroup/cpuset/batch".into())
    );
    // The override replaces only the keys it names: rho and mode come from the top.
    assert_eq!(
        (
            batch.daemon.period_ms,
            batch.daemon.policy.rho,
            batch.daemon.policy.eta
        ),
        (500, 0.8, 0.5)
    );
    assert_eq!(batch.daemon.policy.mode, Mode::Full);
    assert_eq!(
        batch.daemon.state_dir.as_deref(),
        Some(cfg.state_dir.as_path())
    );
}

#[test]
fn defaults_serve_loopback_and_manage_nothing() {
    let cfg = parse("").unwrap();
    assert_eq!(cfg.metrics.listen, Some(DEFAULT_LISTEN.parse().unwrap()));
    assert!(cfg.targets.is_empty());
    assert_eq!(
        parse("[metrics]\nlisten = \"\"").unwrap().metrics.listen,
        None
    );
}

#[test]
fn bad_configs_are_refused_with_one_line_naming_the_fix() {
    for (text, needle) in [
        ("[[target]]\nname = \"x\"", "exactly one of"),
        (
            "[[target]]\nunit = \"a.service\"\ncgroup = \"/x\"",
            "exactly one of",
        ),
        ("[[target]]\ncgroup = \"relative/dir\"", "absolute path"),
        ("[[target]]\ncgroup = \"/a/../b\"", "absolute path"),
        ("[[target]]\nunit = \"mysql\"", "not a unit name"),
        (
            "[[target]]\nunit = \"a.service\"\n[target.policy]\nrho = 2.0",
            "outside (0, 1]",
        ),
        (
            "[[target]]\nunit = \"a.service\"\nperiod_ms = 1",
            "out of range",
        ),
        (
            "[[target]]\nunit = \"a.service\"\nbogus = 1",
            "unknown field",
        ),
        (
            "[[target]]\nunit = \"a.service\"\nstate_dir = \"/tmp\"",
            "service-wide",
        ),
        (
            "progress_file = \"/run/tx\"\n[[target]]\nunit = \"a.service\"",
            "per target",
        ),
        (
            "progress_url = \"http://127.0.0.1:9100/metrics\"\nprogress_metric = \"tx\"\n[[target]]\nunit = \"a.service\"",
            "per target",
        ),
        (
            "[[target]]\nunit = \"a.service\"\n[[target]]\nunit = \"a.service\"",
            "two targets",
        ),
        (
            "[[target]]\ncgroup = \"/x\"\nname = \"bad name\"",
            "must be 1-100",
        ),
        ("target = 3", "[[target]]"),
        ("[metrics]\nlisten = \"0.0.0.0:9477\"", "allow_non_loopback"),
        ("[metrics]\nlisten = \"localhost\"", "not an address"),
        ("[metrics]\nport = 1", "[metrics]"),
        (
            "[metrics]\ntextfile = \"gleaner.prom\"",
            "absolute file path",
        ),
        ("[metrics]\ntextfile_interval_s = 0", "out of range"),
        ("[policy]\neta = 0", "outside (0, 1]"),
        ("[policy", "malformed TOML"),
    ] {
        let err = format!("{:#}", parse(text).unwrap_err());
        assert!(err.contains(needle), "{text:?}: {err}");
        assert!(!err.contains('\n'), "{text:?}: {err}");
    }
    // Explicitly allowed, a non-loopback endpoint is accepted.
    assert!(parse("[metrics]\nlisten = \"0.0.0.0:9477\"\nallow_non_loopback = true").is_ok());
}

#[test]
fn shipped_default_config_is_valid_commented_and_uncommented() {
    let shipped = include_str!("../../../../packaging/gleaner.toml");
    let cfg = parse(shipped).unwrap();
    assert!(cfg.targets.is_empty());
    // Every commented-out setting (`#key = ...`, no space after #) must be valid too.
    let uncommented: String = shipped
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if !rest.is_empty() && !rest.starts_with([' ', '#']) => rest,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = parse(&uncommented).unwrap();
    assert_eq!(cfg.targets.len(), 2);
    assert_eq!(cfg.targets[1].daemon.policy.rho, 0.9);
    assert_eq!(
        cfg.metrics.textfile.as_deref(),
        Some(Path::new("/var/lib/prometheus/node-exporter/gleaner.prom"))
    );
}

#[test]
fn unit_names_map_to_systemd_cgroup_paths() {
    assert_eq!(
        default_unit_cgroup("mysql.service"),
        Path::new("system.slice/mysql.service")
    );
    assert_eq!(default_unit_cgroup("db.slice"), Path::new("db.slice"));
    assert_eq!(
        default_unit_cgroup("db-mysql.slice"),
        Path::new("db.slice/db-mysql.slice")
    );
    assert_eq!(default_unit_cgroup("-.slice"), Path::new(""));
}

#[test]
fn instance_config_round_trips_through_the_attach_loader() {
    let cfg = parse(FULL).unwrap();
    let text = toml::to_string(&cfg.targets[1].daemon).unwrap();
    assert_eq!(crate::config::parse(&text).unwrap(), cfg.targets[1].daemon);
}

/// A fake cgroup v2 tree: `root` stands for the mount, with the given cgroups under it.
fn fake_v2(root: &Path) -> Detection {
    Detection {
        kind: PlacementKind::CgroupV2,
        mounts: gleaner_linux::cgroup::CgroupMounts {
            v2: Some(root.to_path_buf()),
            v1_cpuset: None,
            v1_cpuacct: None,
        },
        skipped: vec![],
    }
}

#[test]
fn empty_cgroups_are_not_managed_until_a_process_appears() {
    let dir = tempfile::tempdir().unwrap();
    let det = fake_v2(dir.path());
    let root = dir.path().join("svc");
    std::fs::create_dir_all(root.join("child")).unwrap();
    std::fs::write(root.join("cgroup.procs"), "").unwrap();
    std::fs::write(root.join("cpuset.cpus"), "0-1\n").unwrap();
    std::fs::write(root.join("child/cgroup.procs"), "").unwrap();
    assert!(!has_tasks(&root));
    let err = resolve_in(&CgroupRef::Path(root.clone()), &det).unwrap_err();
    assert!(
        matches!(&err, Unmanaged::Waiting(w) if w.contains("no processes")),
        "{err:?}"
    );
    std::fs::write(root.join("child/cgroup.procs"), "1234\n").unwrap();
    assert_eq!(
        resolve_in(&CgroupRef::Path(root.clone()), &det).unwrap(),
        root
    );
    let err = resolve_in(&CgroupRef::Path(dir.path().join("absent")), &det).unwrap_err();
    assert!(
        matches!(&err, Unmanaged::Waiting(w) if w.contains("does not exist")),
        "{err:?}"
    );
}

#[test]
fn a_cgroup_that_cannot_be_managed_is_failing_not_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let det = fake_v2(&dir.path().join("cgroup2"));
    // Outside every cpuset hierarchy.
    let outside = dir.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("cgroup.procs"), "1\n").unwrap();
    let err = resolve_in(&CgroupRef::Path(outside), &det).unwrap_err();
    assert!(
        matches!(&err, Unmanaged::Failing(w) if w.contains("not inside a cpuset hierarchy")),
        "{err:?}"
    );
    // In the v2 tree, but without the cpuset controller enabled.
    let nocpuset = dir.path().join("cgroup2/app.slice");
    std::fs::create_dir_all(&nocpuset).unwrap();
    std::fs::write(nocpuset.join("cgroup.procs"), "1\n").unwrap();
    let err = resolve_in(&CgroupRef::Path(nocpuset), &det).unwrap_err();
    assert!(
        matches!(&err, Unmanaged::Failing(w) if w.contains("AllowedCPUs")),
        "{err:?}"
    );
}

#[test]
fn instance_log_lines_name_their_target() {
    let v: serde_json::Value = serde_json::from_str(&tag_line(
        r#"{"level":"INFO","message":"x","added":[]}"#,
        "db",
        true,
    ))
    .unwrap();
    assert_eq!(
        (v["target_name"].as_str(), v["message"].as_str()),
        (Some("db"), Some("x"))
    );
    assert_eq!(v["added"], serde_json::json!([]));
    // Under journald the priority stays in front of the object.
    let prefixed = tag_line(r#"<3>{"level":"ERROR","message":"x"}"#, "db", true);
    assert!(prefixed.starts_with("<3>{"), "{prefixed}");
    // A plain line from a child is made JSON, not passed on as text.
    let v: serde_json::Value =
        serde_json::from_str(&tag_line("gleaner: error: boom", "db", true)).unwrap();
    assert_eq!(
        (
            v["level"].as_str(),
            v["message"].as_str(),
            v["target_name"].as_str()
        ),
        (Some("ERROR"), Some("gleaner: error: boom"), Some("db"))
    );
    assert_eq!(
        tag_line("  INFO managing workload", "db", false),
        "[db]   INFO managing workload"
    );
    assert_eq!(
        tag_line("<6>INFO managing workload", "db", false),
        "<6>[db] INFO managing workload"
    );
}
