//! `gleaner man --out DIR`: writes the man pages from the same clap definitions that
//! produce `gleaner --help`, so the two cannot drift apart. The package build runs it.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes `gleaner.1` and one `gleaner-SUBCOMMAND.1` per visible subcommand into `dir`;
/// returns the files written.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}: pass --out DIR you can write", dir.display()))?;
    let mut cmd = cmd;
    cmd.build();
    let mut written = Vec::new();
    let mut render = |page: clap::Command, file: String| -> Result<()> {
        let mut buf = Vec::new();
        clap_mangen::Man::new(page).render(&mut buf).context("cannot render a man page")?;
        let path = dir.join(file);
        std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("gleaner-{}", sub.get_name());
        render(sub.clone().display_name(name.clone()).bin_name(format!("gleaner {}", sub.get_name())), format!("{name}.1"))?;
    }
    render(cmd.clone(), "gleaner.1".into())?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_the_help_text() {
        let cmd = clap::Command::new("gleaner")
            .about("Mitigates BWW")
            .subcommand(clap::Command::new("daemon").about("Run as a service").arg(clap::Arg::new("config").long("config").help("Service configuration")))
            .subcommand(clap::Command::new("__guard").hide(true));
        let dir = tempfile::tempdir().unwrap();
        let files = write_pages(cmd, dir.path()).unwrap();
        let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().to_string()).collect();
        assert_eq!(names, ["gleaner-daemon.1", "gleaner.1"]);
        let daemon = std::fs::read_to_string(dir.path().join("gleaner-daemon.1")).unwrap();
        assert!(daemon.contains("Service configuration"), "{daemon}");
        let main = std::fs::read_to_string(dir.path().join("gleaner.1")).unwrap();
        assert!(main.contains("Mitigates BWW") && main.contains("daemon"), "{main}");
    }
}
