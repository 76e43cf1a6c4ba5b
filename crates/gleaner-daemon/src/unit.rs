//! The shipped systemd unit (`packaging/gleaner.service`), as code can read it.
//!
//! Exists so that the tests that must run Gleaner exactly as the unit runs it (its capability
//! bounding set, no inheritable capabilities, no new privileges) read those settings from the
//! unit file itself: a change to the unit changes what the tests run under, and the two test
//! suites that need it share one reading.

/// The unit file as shipped.
pub const UNIT: &str = include_str!("../../../packaging/gleaner.service");

/// `setpriv` and its arguments that give a process what the unit gives the daemon: the
/// capability bounding set named by `CapabilityBoundingSet=`, no inheritable capabilities, no
/// new privileges. Run the command to test after them.
pub fn setpriv_args() -> Vec<String> {
    let caps: Vec<String> = UNIT
        .lines()
        .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .flat_map(|l| l.split_whitespace())
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    vec![
        "setpriv".into(),
        format!("--bounding-set=-all,{}", caps.join(",")),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_setpriv_arguments_name_the_units_capabilities() {
        let args = super::setpriv_args();
        assert_eq!(args[0], "setpriv");
        assert!(args[1].starts_with("--bounding-set=-all,+"), "{args:?}");
        assert!(args[1].contains("+sys_nice"), "{args:?}");
        assert!(!args[1].contains("cap_"), "{args:?}");
    }
}
