use super::*;

const MINIMAL: &str = r#"
        [host]
        pcpus = 2
        [[vm]]
        vcpus = 2
        workload = { preset = "matmul" }
    "#;

fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    Scenario::from_str(text, Path::new("t.toml"))
}

#[test]
fn minimal_scenario_gets_defaults() {
    let s = parse(MINIMAL).unwrap();
    assert_eq!(s.host.policy, HostPolicy::Cfs);
    assert_eq!(s.costs.ipi.0, 11_000);
    assert_eq!(s.vms[0].guest, GuestPolicy::None);
    assert_eq!(s.vms[0].expanded().0[0].count, 2);
}

#[test]
fn errors_are_one_line_and_name_the_problem() {
    let cases = [
            ("[host]\npcpus = \n", "t.toml:2:"),
            ("[host]\npcpus = 2\npolicy = \"fifo\"\n[[vm]]\nvcpus=1\nworkload={preset=\"matmul\"}", "unknown variant"),
            ("[host]\npcpus = 0\n[[vm]]\nvcpus=1\nworkload={preset=\"matmul\"}", "host.pcpus"),
            ("[host]\npcpus = 2\n", "missing field"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\n", "no threads"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\n[[vm.threads]]\npin = 5\nprogram = [{compute = \"1us\"}]", "vm[0].threads[0].pin"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\n[[vm.threads]]\nprogram = [{lock = \"m\"}, {unlock = \"m\"}]", "time advances"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\n[[vm.threads]]\nprogram = [{compute = \"1 parsec\"}]", "unknown unit"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\nhost_cpus = \"0-7\"\nworkload={preset=\"matmul\"}", "host CPU 2 does not exist"),
            ("[host]\npcpus = 2\n[[vm]]\nvcpus = 2\nbarriers = { b = 3 }\n[[vm.threads]]\ncount = 2\nprogram = [{compute = 5}, {barrier = \"b\"}]", "never open"),
            ("[host]\npcpus = 2\nbogus = 1\n[[vm]]\nvcpus = 2\nworkload={preset=\"matmul\"}", "unknown field"),
        ];
    for (text, needle) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(!err.contains('\n'), "multi-line error: {err}");
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }
}

#[test]
fn type_errors_name_line_and_column_never_zero() {
    // A field of the wrong type: the position of the field's value in the file.
    let text = "[host]\npcpus = 2\n[[vm]]\nvcpus = \"x\"\nworkload = { preset = \"matmul\" }\n";
    let err = parse(text).unwrap_err().to_string();
    assert!(err.starts_with("t.toml:4:9: "), "{err}");
    // An unknown field and a missing one: still positioned, never the old `:0:0:`.
    for text in [
        "[host]\npcpus = 2\nbogus = 1\n[[vm]]\nvcpus = 2\nworkload={preset=\"matmul\"}",
        "[host]\npcpus = 2\n",
    ] {
        let err = parse(text).unwrap_err().to_string();
        assert!(!err.contains(":0:0:"), "{err}");
    }
    // A tree changed by a sweep has no text: no position at all.
    let value = parse_value(text, Path::new("t.toml")).unwrap();
    let err = Scenario::from_value(value, Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("t.toml: invalid type"), "{err}");
}

#[test]
fn a_missing_file_is_named_once_with_its_cause_once() {
    let err = Scenario::load(Path::new("/nonexistent/scenario.toml")).unwrap_err();
    // What `gleaner sim` prints: the error with its chain of causes.
    let shown = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(
        shown.matches("No such file or directory").count(),
        1,
        "{shown}"
    );
    assert!(shown.contains("/nonexistent/scenario.toml"), "{shown}");
}

#[test]
fn sweep_overrides_nested_fields() {
    let sweep = Sweep::parse("vm.0.guest=none,gleaner").unwrap();
    let mut value = parse_value(MINIMAL, Path::new("t")).unwrap();
    sweep.apply(&mut value, 1).unwrap();
    let s = Scenario::from_value(value, Path::new("t")).unwrap();
    assert_eq!(s.vms[0].guest, GuestPolicy::Gleaner);

    let sweep = Sweep::parse("vm.0.guest+vm.0.name=hold").unwrap();
    let mut value = parse_value(MINIMAL, Path::new("t")).unwrap();
    sweep.apply(&mut value, 0).unwrap();
    let s = Scenario::from_value(value, Path::new("t")).unwrap();
    assert_eq!(
        (s.vms[0].guest, s.vms[0].name.as_str()),
        (GuestPolicy::Hold, "hold")
    );

    let sweep = Sweep::parse("costs.ipi=5us").unwrap();
    let mut value = parse_value(MINIMAL, Path::new("t")).unwrap();
    sweep.apply(&mut value, 0).unwrap();
    assert_eq!(
        Scenario::from_value(value, Path::new("t"))
            .unwrap()
            .costs
            .ipi
            .0,
        5_000
    );
    let mut value = parse_value(MINIMAL, Path::new("t")).unwrap();
    Sweep::parse("costs.ipj=5us")
        .unwrap()
        .apply(&mut value, 0)
        .unwrap();
    let err = Scenario::from_value(value, Path::new("t"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `ipj`"), "{err}");

    let sweep = Sweep::parse("host.pcpus=4,8").unwrap();
    assert_eq!(sweep.values[1], toml::Value::Integer(8));
    assert!(Sweep::parse("host.pcpus").is_err());
    assert!(Sweep::parse("host..pcpus=1").is_err());
    assert!(Sweep::parse("host.pcpus+=1").is_err());
    let mut value = parse_value(MINIMAL, Path::new("t")).unwrap();
    let err = Sweep::parse("vm.3.guest=none")
        .unwrap()
        .apply(&mut value, 0)
        .unwrap_err();
    assert!(err.to_string().contains("out of range"));
}
