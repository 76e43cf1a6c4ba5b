use super::*;
use gleaner_linux::cgroup::CgroupMounts;
use std::os::unix::fs::PermissionsExt;

/// Set in the copy of this test that runs under the unit's capabilities.
const UNDER_UNIT_CAPS: &str = "GLEANER_TEST_UNDER_UNIT_CAPS";

/// A fake cgroup v2 tree like a real one: the root read-only (0555) and a cgroup whose
/// cpuset.cpus its owner may write (0644). Run as root, the test runs itself again under
/// the unit's capabilities (no CAP_DAC_OVERRIDE), where the root is not writable either;
/// as another user, the modes alone make the root not writable.
#[test]
fn an_existing_cgroup_is_judged_by_its_own_files_not_the_hierarchy_root() {
    let is_root = crate::config::is_root();
    if is_root && std::env::var_os(UNDER_UNIT_CAPS).is_none() {
        let sp = crate::unit::setpriv_args();
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(&sp[0])
                .args(&sp[1..])
                .arg(exe)
                .args(["--exact", "daemon::tests::an_existing_cgroup_is_judged_by_its_own_files_not_the_hierarchy_root", "--nocapture", "--test-threads=1"])
                .env(UNDER_UNIT_CAPS, "1")
                .output();
        match out {
            Ok(o)
                if o.status.success()
                    && String::from_utf8_lossy(&o.stdout).contains("1 passed") =>
            {
                return
            }
            Ok(o)
                if o.status.success()
                    || String::from_utf8_lossy(&o.stderr).contains("setpriv:") =>
            {
                eprintln!("skipping the run under the unit's capabilities (setpriv cannot drop them here): {o:?}")
            }
            Ok(o) => panic!(
                "under the unit's capabilities: {}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                eprintln!("skipping the run under the unit's capabilities: no setpriv ({e})")
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup2");
    let app = root.join("app.slice");
    let ro = root.join("ro.slice");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    for d in [&root, &app, &ro] {
        std::fs::write(d.join("cpuset.cpus"), "0-1\n").unwrap();
    }
    std::fs::set_permissions(
        ro.join("cpuset.cpus"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o555)).unwrap();
    let mounts = CgroupMounts {
        v2: Some(root.clone()),
        v1_cpuset: None,
        v1_cpuacct: None,
    };
    let root_writable = nix::unistd::access(&root, nix::unistd::AccessFlags::W_OK).is_ok();
    let result = cgroup_target_backend(&mounts, &app);
    let ro_result = cgroup_target_backend(&mounts, &ro);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    if !is_root || std::env::var_os(UNDER_UNIT_CAPS).is_some() {
        assert!(!root_writable, "the fake root should not be writable here");
        let err = ro_result.unwrap_err();
        assert!(
            err.contains("ro.slice/cpuset.cpus is not writable"),
            "{err}"
        );
    }
    assert_eq!(result, Ok(PlacementKind::CgroupV2));
    // A v1 cpuset hierarchy mounted inside the v2 tree is the longer, deciding mount.
    let v1 = root.join("cpuset");
    std::fs::create_dir_all(v1.join("db")).unwrap();
    std::fs::write(v1.join("db/cpuset.cpus"), "0\n").unwrap();
    let both = CgroupMounts {
        v2: Some(root.clone()),
        v1_cpuset: Some(v1.clone()),
        v1_cpuacct: None,
    };
    assert_eq!(
        cgroup_target_backend(&both, &v1.join("db")),
        Ok(PlacementKind::CgroupV1)
    );
    let err = cgroup_target_backend(&mounts, dir.path()).unwrap_err();
    assert!(err.contains("not inside a cpuset hierarchy"), "{err}");
}
