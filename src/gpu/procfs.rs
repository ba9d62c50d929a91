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
    all_pids().into_iter().any(|p| {
        proc_stat(p).is_some_and(|(state, pgrp)| pgrp == pgid && state != 'Z' && state != 'X')
    })
}

/// The process's environment holds exactly `tag` (`NAME=value`).
pub(crate) fn has_env(pid: i32, tag: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|environ| environ.split(|b| *b == 0).any(|kv| kv == tag.as_bytes()))
}

/// When this host booted, in Unix seconds (`btime` of `/proc/stat`).
fn boot_unix_s() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// When `pid` started, in Unix milliseconds (field 22 of its stat, in clock ticks since boot).
fn start_unix_ms(pid: i32) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // After the `)`: state is field 3, so starttime (22) is the 20th.
    let ticks: i64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second() as i64;
    Some(boot_unix_s()? * 1000 + ticks * 1000 / hz.max(1))
}

/// How far a lease's lead may have started after its grant was journaled (the spawn follows
/// the commit within milliseconds; this allows for the wall clock being stepped).
const START_SLACK_MS: i64 = 60_000;

/// True when process group `pgid`, journaled for a lease granted at `granted_unix_ms`, cannot
/// be that lease's any more: the host booted since the grant, or the group's leader (the
/// process whose pid is `pgid`) started well after it, so the id was freed and given to a
/// later process. A group whose leader is gone is still the lease's: an id in use as a group
/// is never handed out again. Unreadable facts count as "still the lease's".
pub(crate) fn group_reused(pgid: i64, granted_unix_ms: i64) -> bool {
    if boot_unix_s().is_some_and(|boot| boot * 1000 > granted_unix_ms + START_SLACK_MS) {
        return true;
    }
    let Ok(pid) = i32::try_from(pgid) else {
        return false;
    };
    live(pid) && start_unix_ms(pid).is_some_and(|start| start > granted_unix_ms + START_SLACK_MS)
}
