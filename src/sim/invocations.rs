//! The simulated bench's own record of its invocations, for checks that must not trust the
//! store (`cargo bench --bench chaos` counts benches run twice from it).
//!
//! With `FK_AGENTD_SIM_INVOCATIONS=<file>` in its environment (the daemon passes its own on to
//! leased commands), each simulated bench appends `start\t<pid>\t<session>\t<args>` before it
//! works and `end\t<pid>\t<code>` after; a bench killed in between leaves only its start line.
//! Lines are single small appends, so concurrent benches do not interleave within a line.

use std::io::Write;

/// The variable naming the log.
pub const LOG_ENV: &str = "FK_AGENTD_SIM_INVOCATIONS";

/// Runs `bench` (a simulated bench process's work, returning its exit code) between its two
/// log lines when the log is asked for.
pub fn logged(bench: impl FnOnce() -> i32) -> i32 {
    let Some(path) = std::env::var_os(LOG_ENV).filter(|p| !p.is_empty()) else {
        return bench();
    };
    let pid = std::process::id();
    let session = std::env::var("FK_AGENTD_SESSION").unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    append(
        &path,
        &format!("start\t{pid}\t{session}\t{}\n", args.join(" ")),
    );
    let code = bench();
    append(&path, &format!("end\t{pid}\t{code}\n"));
    code
}

fn append(path: &std::ffi::OsStr, line: &str) {
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("fastkernels bench (simulated): cannot append to {LOG_ENV}: {e}");
    }
}
