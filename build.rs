//! Embeds the fk-agentd commit (`FK_AGENTD_COMMIT`) for run manifests: `git rev-parse HEAD`,
//! with `-dirty` when tracked files differ from it, or "unknown" when git or the checkout is
//! absent (a source tarball). Re-runs when HEAD moves or a source file changes.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{c}-dirty") } else { c }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=FK_AGENTD_COMMIT={commit}");
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["rev-parse", "--git-path", "index"]),
    ]
    .into_iter()
    .flatten()
    {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
}
