//! What an operator gets from the package and the unit, checked without building a .deb
//! (that needs cargo-deb; `lintian` on its output found no errors, see docs/OPERATING.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

const UNIT: &str = include_str!("../../../packaging/gleaner.service");
const MANIFEST: &str = include_str!("../Cargo.toml");
const CHANGELOG: &str = include_str!("../../../packaging/changelog");
const POSTINST: &str = include_str!("../../../packaging/postinst");

fn unit_lines() -> Vec<&'static str> {
    UNIT.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn the_unit_waits_for_readiness_keeps_a_watchdog_and_does_not_restart_on_a_bad_config() {
    let lines = unit_lines();
    for want in [
        "Type=notify",
        "NotifyAccess=main",
        "RestartPreventExitStatus=2",
        "MemoryMax=256M",
        "TasksMax=1024",
    ] {
        assert!(lines.contains(&want), "the unit lacks {want}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with("WatchdogSec=")),
        "no watchdog"
    );
    // ProtectSystem=strict leaves /sys writable: a ReadWritePaths= line for it does nothing.
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("ReadWritePaths=") && l.contains("/sys")),
        "{UNIT}"
    );
}

#[test]
fn the_package_metadata_is_what_lintian_asks_for() {
    let manifest: toml::Table = toml::from_str(MANIFEST).unwrap();
    let deb = &manifest["package"]["metadata"]["deb"];
    let maintainer = deb["maintainer"].as_str().unwrap();
    assert!(
        maintainer.contains(" <") && maintainer.ends_with('>') && maintainer.contains('@'),
        "malformed-contact: {maintainer}"
    );
    assert!(
        deb["copyright"]
            .as_str()
            .unwrap()
            .chars()
            .next()
            .unwrap()
            .is_ascii_digit(),
        "a copyright notice starts with the year"
    );
    assert_eq!(deb["changelog"].as_str(), Some("../../packaging/changelog"));
    assert_eq!(deb["recommends"].as_str(), Some("prometheus-node-exporter"));
    // The changelog names this version and the same maintainer; its text lines fit 80 columns.
    let version = include_str!("../../../Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .unwrap()
        .trim_end_matches('"');
    assert!(
        CHANGELOG.starts_with(&format!("gleaner ({version}-1) ")),
        "{CHANGELOG}"
    );
    assert!(
        CHANGELOG.contains(&format!(" -- {maintainer}  ")),
        "{CHANGELOG}"
    );
    for l in CHANGELOG.lines().filter(|l| !l.starts_with(" -- ")) {
        assert!(l.len() <= 80, "changelog line too long: {l}");
    }
    // The textfile directory of Debian's node-exporter, which the default config names.
    assert!(
        POSTINST.contains("/var/lib/prometheus/node-exporter") && POSTINST.contains("#DEBHELPER#")
    );
    let assets = deb["assets"].as_array().unwrap();
    for doc in ["OPERATING.md", "SAFETY.md", "grafana-dashboard.json"] {
        assert!(
            assets.iter().any(|a| a[1].as_str().unwrap().ends_with(doc)),
            "{doc} not packaged"
        );
    }
}
