//! `gleaner man --out DIR`: writes the man pages from the same clap definitions that
//! produce `gleaner --help`, so the two cannot drift apart. The package build runs it.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes `gleaner.1` and one `gleaner-SUBCOMMAND.1` per visible subcommand into `dir`;
/// returns the files written.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create {}: pass --out DIR you can write",
            dir.display()
        )
    })?;
    let mut cmd = cmd;
    cmd.build();
    let version = cmd
        .get_version()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
        .to_string();
    let mut written = Vec::new();
    let mut render = |page: clap::Command, file: String, extra: &str| -> Result<()> {
        let buf = render_page(page, &version, extra).context("cannot render a man page")?;
        let path = dir.join(file);
        std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = format!("gleaner-{}", sub.get_name());
        let extra = match sub.get_name() {
            "daemon" => DAEMON_SECTIONS,
            "status" => STATUS_SECTIONS,
            "run" | "attach" => RUN_SECTIONS,
            "recover" => RECOVER_SECTIONS,
            _ => "",
        };
        render(
            sub.clone()
                .display_name(name.clone())
                .bin_name(format!("gleaner {}", sub.get_name())),
            format!("{name}.1"),
            extra,
        )?;
    }
    render(cmd.clone(), "gleaner.1".into(), MAIN_SECTIONS)?;
    Ok(written)
}

/// One page: clap's sections, then `extra` (roff) before the version. The footer names
/// "gleaner VERSION" on every page (a subcommand has no version of its own).
fn render_page(page: clap::Command, version: &str, extra: &str) -> std::io::Result<Vec<u8>> {
    let has_args = page.get_arguments().any(|a| !a.is_hide_set());
    let has_subs = page.get_subcommands().any(|s| !s.is_hide_set());
    let has_version = page.get_version().is_some();
    let man = clap_mangen::Man::new(page)
        .source(format!("gleaner {version}"))
        .manual("Gleaner");
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if has_args {
        man.render_options_section(&mut buf)?;
    }
    if has_subs {
        man.render_subcommands_section(&mut buf)?;
    }
    buf.extend_from_slice(extra.as_bytes());
    if has_version {
        man.render_version_section(&mut buf)?;
    }
    Ok(buf)
}

const MAIN_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
.B 0
success.
.TP
.B 1
.B gleaner recover
could not undo every change it found (each is named on stderr).
.TP
.B 2
an error: invalid flags or configuration, a file that cannot be read or written, a
back end that cannot be used here; one line on stderr names the problem and the fix.
.PP
.B gleaner run
exits with its workload's exit status, or 128+N when the workload or Gleaner was stopped by
signal N.
.SH "SEE ALSO"
.BR gleaner\-daemon (1),
.BR gleaner\-run (1),
.BR gleaner\-status (1),
.BR gleaner\-recover (1);
docs/OPERATING.md and docs/SAFETY.md, installed in /usr/share/doc/gleaner.
"#;

const RUN_SECTIONS: &str = r#".SH SIGNALS
.TP
.BR SIGTERM ", " SIGINT ", " SIGHUP
restore every CPU setting (cpuset, affinity, PM QoS), remove the crash journal and exit.
.TP
.B SIGKILL
the guard process restores from the crash journal within milliseconds.
.SH FILES
.TP
.IR STATE_DIR /PID.json
crash journal of instance PID: every change before it is made. Read by the guard and by
.BR "gleaner recover" .
.TP
.IR STATE_DIR /PID.status
live state, read by
.BR "gleaner status" .
.TP
.IR STATE_DIR /calibration.json
the retention hold measured on this boot (one entry per retention back end), cached only when repeated measurements agreed.
.PP
STATE_DIR is /run/gleaner as root, else $XDG_RUNTIME_DIR/gleaner, or \-\-state\-dir.
.SH "EXIT STATUS"
The workload's exit status
.RB ( "gleaner run" ),
0 when an attached workload ended, 128+N when stopped by signal N, 2 on an error.
"#;

const STATUS_SECTIONS: &str = r#".SH FILES
Reads
.IR STATE_DIR /daemon.status
(every configured target of a running
.BR "gleaner daemon" :
managed, starting, waiting or failing, and why) and
.IR STATE_DIR /PID.status
(each running instance). STATE_DIR is \-\-state\-dir, else the state_dir of \-\-config or of
/etc/gleaner/gleaner.toml, else /run/gleaner.
.SH "EXIT STATUS"
0, or 2 when the state directory cannot be read.
"#;

const RECOVER_SECTIONS: &str = r#".SH "EXIT STATUS"
0 when everything found was undone (or nothing was found), 1 when a change could not be
undone (its journal is kept; run again once the cause is fixed), 2 on an error.
"#;

const DAEMON_SECTIONS: &str = r#".SH CONFIGURATION
The file (default /etc/gleaner/gleaner.toml) is TOML. Keys at the top apply to every target;
a target may override any of them except state_dir.
.TP
.B period_ms
sampling and decision period, 10 to 60000 (default 100).
.TP
.B backend
where CPUs are taken away: auto, cgroup\-v2, cgroup\-v1 (default auto; a target's cgroup
decides).
.TP
.B retention_backend
how idle vCPUs are held: auto (in\-kernel polling where the cpuidle driver has a poll state,
else yielding threads), yield, poll.
.TP
.B observe
true: measure and log every decision, apply none (default false).
.TP
.B retention_timeout_us
the hold in microseconds, 1 to 1000000; unset: measured at start (repeated until two runs
agree, outliers rejected) and cached for the boot only if they agreed.
.TP
.B state_dir
crash journals and status files (default /run/gleaner); changing it needs a restart. Under
the unit, another directory is read\-only unless the unit is given ReadWritePaths= for it.
.TP
.B [policy] mode
full, retention, consolidation, always\-yield (default full).
.TP
.B [policy] rho
load factor of condition (1), in (0, 1] (default 1.0).
.TP
.B [policy] eta
granularity factor of condition (2), in (0, 1] (default 1.0).
.TP
.B [metrics] listen
Prometheus endpoint (default 127.0.0.1:9477); "" turns it off.
.TP
.B [metrics] allow_non_loopback
true to listen on a non\-loopback address (default false).
.TP
.B [metrics] textfile
node_exporter textfile to write, e.g. /var/lib/prometheus/node\-exporter/gleaner.prom
(default none).
.TP
.B [metrics] textfile_interval_s
how often it is rewritten, 1 to 3600 (default 15).
.TP
.B [[target]] unit
a systemd unit whose cgroup is managed (e.g. "mariadb.service"), or
.TP
.B [[target]] cgroup
a cgroup directory (v2 with the cpuset controller enabled, or a v1 cpuset group);
.TP
.B [[target]] name
the label in metrics and logs (default: the unit, or the cgroup's last component).
.PP
A target is managed when its cgroup exists, holds a process, and its own cpuset.cpus can be
written; until then it is waiting (rechecked every 2 s) or failing (with the reason in
.BR "gleaner status" ,
the journal and gleaner_target_state).
.SH SIGNALS
.TP
.B SIGHUP
reload: the file is read and validated; an invalid file changes nothing (the journal says
why, gleaner_config_last_reload_successful drops to 0). Unchanged targets keep their
instance.
.TP
.BR SIGTERM ", " SIGINT
stop every instance (each restores its target's CPUs), then exit 0.
.SH FILES
.TP
.B /etc/gleaner/gleaner.toml
the configuration; refused when group or others may write it.
.TP
.B /run/gleaner/daemon.status
every target's state, read by
.BR "gleaner status" .
.TP
.BR /run/gleaner/ PID.json ", " PID.status ", " target\-NAME.toml
each instance's crash journal, live state and resolved configuration.
.TP
.B /usr/lib/systemd/system/gleaner.service
the unit: Type=notify with a watchdog; exit status 2 is not restarted.
.SH "EXIT STATUS"
.TP
.B 0
stopped by SIGTERM or SIGINT, every target restored; or \-\-check found the file valid.
.TP
.B 2
the configuration is invalid, the metrics address cannot be bound or the state directory
cannot be created: fix what the one\-line message names (the unit does not restart on 2).
.SH EXAMPLES
Check a configuration and see where each target resolves and whether it can be managed:
.PP
.RS
gleaner daemon \-\-check \-\-config /etc/gleaner/gleaner.toml
.RE
.PP
Manage a cgroup v1 cpuset group and export metrics to node_exporter:
.PP
.RS
.nf
[metrics]
textfile = "/var/lib/prometheus/node\-exporter/gleaner.prom"

[[target]]
name = "batch"
cgroup = "/sys/fs/cgroup/cpuset/batch"
.fi
.RE
.PP
Apply an edited file, and look at every target:
.PP
.RS
.nf
systemctl reload gleaner
gleaner status
.fi
.RE
.SH "SEE ALSO"
.BR gleaner (1),
.BR gleaner\-status (1),
.BR systemd.service (5);
/usr/share/doc/gleaner/OPERATING.md.
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_the_help_text() {
        let cmd = clap::Command::new("gleaner")
            .about("Mitigates BWW")
            .subcommand(
                clap::Command::new("daemon").about("Run as a service").arg(
                    clap::Arg::new("config")
                        .long("config")
                        .help("Service configuration"),
                ),
            )
            .subcommand(clap::Command::new("__guard").hide(true));
        let dir = tempfile::tempdir().unwrap();
        let files = write_pages(cmd, dir.path()).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, ["gleaner-daemon.1", "gleaner.1"]);
        let daemon = std::fs::read_to_string(dir.path().join("gleaner-daemon.1")).unwrap();
        assert!(daemon.contains("Service configuration"), "{daemon}");
        let main = std::fs::read_to_string(dir.path().join("gleaner.1")).unwrap();
        assert!(
            main.contains("Mitigates BWW") && main.contains("daemon"),
            "{main}"
        );
    }

    #[test]
    fn daemon_page_documents_every_config_key_files_signals_exit_status_and_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = clap::Command::new("gleaner")
            .version("9.8.7")
            .subcommand(clap::Command::new("daemon").about("Run as a service"));
        write_pages(cmd, dir.path()).unwrap();
        let page = std::fs::read_to_string(dir.path().join("gleaner-daemon.1")).unwrap();
        for section in [
            "CONFIGURATION",
            "SIGNALS",
            "FILES",
            "\"EXIT STATUS\"",
            "EXAMPLES",
        ] {
            assert!(
                page.contains(&format!(".SH {section}")),
                "no {section} section:\n{page}"
            );
        }
        // The footer names the program and its version, not the subcommand.
        let th = page.lines().find(|l| l.starts_with(".TH")).unwrap();
        assert!(th.contains("gleaner 9.8.7"), "{th}");
        // Every key the shipped config shows (`#key = ...`) is explained.
        let shipped = include_str!("../../../packaging/gleaner.toml");
        let keys: Vec<&str> = shipped
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter(|l| !l.starts_with([' ', '#', '[']) && l.contains(" = "))
            .filter_map(|l| l.split(" = ").next())
            .collect();
        assert!(keys.len() >= 10, "{keys:?}");
        for key in keys {
            assert!(page.contains(key), "man page lacks {key}");
        }
    }
}
