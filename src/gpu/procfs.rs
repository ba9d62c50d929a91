//! What `/proc` says about the processes of a lease: process groups, the lease-id tag in a
//! process's environment, and liveness that does not count zombies.
//!
//! Read-only: nothing here signals a process. Every read tolerates a process that exits
//! between the listing and the read (the answer is then "not this lease's" / "not alive").

use std::path::Path;

use rustix::process::Pid;

/// Every pid `/proc` lists now.
pub(crate) fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// `(state, pgrp)` from `/proc/<pid>/stat`; the command name may hold spaces and parentheses,
/// so fields are read after the last `)`.
pub(crate) fn proc_stat(pid: i32) -> Option<(char, i64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Running or sleeping, not a zombie. A pid `/proc` cannot read counts as gone.
pub(crate) fn live(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// True while a live (non-zombie) process is in process group `pgid`. Reads `/proc` because a
/// zombie that nobody reaps still answers `kill(-pgid, 0)`.
pub(crate) fn group_alive(pgid: i64) -> bool {
    let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    if rustix::process::test_kill_process_group(pid).is_err() {
        return false;
    }
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    all_pids().into_iter().any(|p| match proc_stat(p) {
        Some((state, pgrp)) => pgrp == pgid && state != 'Z' && state != 'X',
        None => false,
    })
}

/// The process's environment holds exactly `tag` (`NAME=value`).
pub(crate) fn has_env(pid: i32, tag: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|environ| environ.split(|b| *b == 0).any(|kv| kv == tag.as_bytes()))
}

/// True when a live process of group `pgid` carries `tag`: the group is still the one that
/// was journaled, not a later one that got the same id.
pub(crate) fn group_has_env(pgid: i64, tag: &str) -> bool {
    all_pids().into_iter().any(|p| {
        matches!(proc_stat(p), Some((state, pgrp)) if pgrp == pgid && state != 'Z' && state != 'X')
            && has_env(p, tag)
    })
}
