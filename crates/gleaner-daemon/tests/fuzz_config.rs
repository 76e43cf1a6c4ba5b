//! Fuzzing the daemon's TOML configuration parser.
//!
//! Exists because a config file is the one input a root daemon takes from a file an operator
//! edits by hand: whatever is in it — truncated, oversized, wrong types, NaN, huge numbers —
//! must give a validated config or a one-line error that says what is wrong, never a panic and
//! never a config that slips past validation. Replays the committed seeds in
//! `fuzz/corpus/config_toml/` (whole and truncated), then mutates them with proptest.
//! `PROPTEST_CASES=N` makes a longer run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: a failed assumption is a failed test

use gleaner_daemon::config;

use std::path::{Path, PathBuf};

use proptest::prelude::*;

fn corpus() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config_toml");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned())
        .collect()
}

/// Parses `text`; an accepted config must validate, a refused one must explain in one line.
fn check(text: &str) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| config::parse(text));
    let Ok(result) = outcome else {
        return Err(TestCaseError::fail(format!(
            "parse panicked on {:?}",
            &text[..text.len().min(200)]
        )));
    };
    match result {
        Ok(cfg) => prop_assert!(
            cfg.validate().is_ok(),
            "accepted an invalid config: {cfg:?}"
        ),
        Err(e) => {
            let msg = format!("{e:#}");
            prop_assert!(!msg.trim().is_empty());
            prop_assert!(!msg.contains('\n'), "multi-line error: {msg}");
        }
    }
    Ok(())
}

#[test]
fn corpus_replays_whole_and_truncated() {
    let seeds = corpus();
    assert!(!seeds.is_empty());
    for seed in seeds {
        let cuts: Vec<usize> = (0..=seed.len())
            .filter(|i| seed.is_char_boundary(*i))
            .collect();
        for cut in cuts {
            if let Err(e) = check(&seed[..cut]) {
                panic!("{e}");
            }
        }
    }
}

#[test]
fn documented_keys_with_bad_values_name_the_problem() {
    for (text, needle) in [
        ("period_ms = 1e400\n", "malformed TOML"),
        ("period_ms = 18446744073709551616\n", "malformed TOML"),
        ("[policy]\nrho = nan\n", "rho"),
        ("[policy]\neta = inf\n", "eta"),
        ("period_ms = -5\n", "malformed TOML"),
        ("retention_timeout_us = 0\n", "out of range"),
    ] {
        let err = format!("{:#}", config::parse(text).unwrap_err());
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

/// Lines built from the real keys, so mutations reach validation and not only the TOML lexer.
fn line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("period_ms".to_string()),
        Just("backend".to_string()),
        Just("retention_backend".to_string()),
        Just("observe".to_string()),
        Just("retention_timeout_us".to_string()),
        Just("state_dir".to_string()),
        Just("[policy]".to_string()),
        Just("mode".to_string()),
        Just("rho".to_string()),
        Just("eta".to_string()),
        "[a-z_]{1,12}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("true".to_string()),
        Just("\"affinity\"".to_string()),
        Just("\"cgroup-v1\"".to_string()),
        Just("\"full\"".to_string()),
        Just("\"/run/x\"".to_string()),
        "\"[ -~]{0,20}\"",
        "[ -~]{0,10}",
    ];
    (key, value).prop_map(|(k, v)| {
        if k.starts_with('[') {
            k
        } else {
            format!("{k} = {v}")
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn key_value_soup_never_panics(lines in proptest::collection::vec(line(), 0..8)) {
        check(&lines.join("\n"))?;
    }

    #[test]
    fn mutated_seeds_never_panic(seed in any::<usize>(), at in any::<usize>(), insert in "[ -~\n\t]{0,16}", repeat in 1usize..50) {
        let seeds = corpus();
        let mut text = seeds[seed % seeds.len()].clone();
        let mut at = at % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.insert_str(at, &insert);
        check(&text.repeat(repeat))?;
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        check(&text)?;
    }
}
