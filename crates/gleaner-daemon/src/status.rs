//! `gleaner status`: what each running instance is doing and why.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use gleaner_linux::journal::Journal;
use gleaner_linux::status::{read_statuses, InstanceStatus};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    /// Directory of status files [default: /run/gleaner, or $XDG_RUNTIME_DIR/gleaner]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

pub fn run(args: StatusArgs) -> Result<()> {
    let dir = args.state_dir.unwrap_or_else(Journal::default_dir);
    let all = read_statuses(&dir).with_context(|| format!("cannot read status files in {}", dir.display()))?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if all.is_empty() {
        crate::outln!("no running gleaner instance (looked in {})", dir.display());
    }
    for s in &all {
        print!("{}", render(s));
    }
    Ok(())
}

fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1e3)
}

pub fn render(s: &InstanceStatus) -> String {
    let c = &s.characteristics;
    let mut out = String::new();
    out += &format!("gleaner pid {} — {}\n", s.pid, s.command);
    out += &format!(
        "  mode {}{}  placement {}  retention {}  idle counts from {}  up {:.0} s ({} periods)\n",
        s.mode,
        if s.observe { " (observe only)" } else { "" },
        s.placement,
        s.retention_backend,
        s.idle_source,
        s.uptime_s,
        s.periods
    );
    // A hold that never times out (always-yield) is stored as u64::MAX ns.
    let hold = if s.retention_timeout.ns == gleaner_policy::FOREVER_NS {
        "none (held until work arrives)".to_string()
    } else {
        format!("{:.1} µs", s.retention_timeout.as_us_f64())
    };
    out += &format!("  active vCPUs {} of {}   rho {:.3}  eta {:.3}  retention timeout {hold}\n", s.active, s.allowed, s.rho, s.eta);
    out += &format!(
        "  l_comp {}  g_comp {}  l_idle {}  utilization {:.2}  runnable wait {:.0} %  steal {:.1} %\n",
        us(c.l_comp_ns),
        us(c.g_comp_ns),
        us(c.l_idle_ns),
        c.total_util,
        c.runnable_wait_fraction * 100.0,
        c.steal_fraction * 100.0
    );
    out += &format!(
        "  consolidations {}  rollbacks {}  major changes {}  retention CPU {:.2} s  gleaner CPU {:.2} s\n",
        s.consolidations, s.rollbacks, s.major_changes, s.retention_cpu_s, s.self_cpu_s
    );
    out += &format!(
        "  periods missed {}  discarded {}  latest wake-up {:.1} ms late  controller nice {}\n",
        s.missed_periods, s.disrupted_periods, s.max_late_ms, s.controller_nice
    );
    out += "  vCPU  active  held  work %  idle transitions/s  halts/s  steal %\n";
    for v in &s.vcpus {
        out += &format!(
            "  {:>4}  {:>6}  {:>4}  {:>6.1}  {:>18.0}  {:>7.0}  {:>7.1}\n",
            v.cpu,
            if v.active { "yes" } else { "no" },
            if v.retaining { "yes" } else { "no" },
            v.work_util * 100.0,
            v.idle_transitions_per_sec,
            v.halts_per_sec,
            v.steal_fraction * 100.0
        );
    }
    if !s.last_events.is_empty() {
        out += "  last decisions:\n";
        for e in s.last_events.iter().rev().take(8) {
            out += &format!("    period {:>5}: {:?} — {}\n", e.period, e.kind, e.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_yield_shows_its_mode_name_and_no_timeout() {
        let s = InstanceStatus {
            mode: gleaner_policy::Mode::AlwaysYield.to_string(),
            retention_timeout: gleaner_policy::RetentionTimeout { ns: gleaner_policy::FOREVER_NS },
            ..InstanceStatus::default()
        };
        let text = render(&s);
        assert!(text.contains("mode always-yield"), "{text}");
        assert!(text.contains("retention timeout none (held until work arrives)"), "{text}");
        let s = InstanceStatus { retention_timeout: gleaner_policy::RetentionTimeout { ns: 18_000 }, ..s };
        assert!(render(&s).contains("retention timeout 18.0 µs"));
    }
}
