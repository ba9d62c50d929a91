//! The confinement where the kernel has no Landlock: agent code enters its own user, mount and
//! PID namespaces, where each folder holding a secret is covered by an empty read-only tmpfs
//! and `/proc` is the namespace's own. The new `/proc` matters: without it, `/proc/<pid>/root`
//! of any process of the same user outside the namespace would reopen the covered folder.
//!
//! Entered between fork and exec like the Landlock ruleset. A new PID namespace takes effect
//! for children only, so the forked child forks once more: the grandchild, the namespace's
//! first process, mounts the new `/proc` and goes on to exec the command; the child waits for
//! it and exits as it did (its exit code, or its signal). The grandchild dies with the child
//! (`PR_SET_PDEATHSIG`), and every process of the namespace with the grandchild, so a signal
//! that ends the child ends the whole command.
//!
//! The command runs under a user id that is not 0 inside the namespace (the daemon's own, or
//! 1 for a root daemon), so `execve` leaves it no capability to unmount the covers with.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What a child needs to enter the namespaces, built before the fork: only plain system calls
/// on this data happen after it.
#[derive(Debug)]
pub struct Plan {
    uid_map: CString,
    gid_map: CString,
    covers: Vec<CString>,
}

impl Plan {
    /// A plan covering each folder of `covers` (existing, canonical).
    pub fn new(covers: &[PathBuf]) -> io::Result<Self> {
        let map = |outer: u32| {
            let inner = if outer == 0 { 1 } else { outer };
            CString::new(format!("{inner} {outer} 1\n")).map_err(io::Error::other)
        };
        Ok(Self {
            uid_map: map(rustix::process::getuid().as_raw())?,
            gid_map: map(rustix::process::getgid().as_raw())?,
            covers: covers
                .iter()
                .map(|p| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other))
                .collect::<io::Result<_>>()?,
        })
    }

    /// Enters the namespaces; returns in the namespace's first process, ready to exec. The
    /// process that called it never returns: it waits for that one and exits as it did. Only
    /// for a child between fork and exec (single-threaded); allocates nothing.
    pub fn enter(&self) -> io::Result<()> {
        // SAFETY: unshare(2) takes flags only.
        check(unsafe {
            libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID)
        })?;
        super::write_in_child(c"/proc/self/setgroups", b"deny")?;
        super::write_in_child(c"/proc/self/uid_map", self.uid_map.as_bytes())?;
        super::write_in_child(c"/proc/self/gid_map", self.gid_map.as_bytes())?;
        // SAFETY: mount(2) with valid C strings (or null where the call ignores the argument).
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        for cover in &self.covers {
            // SAFETY: as above; `cover` lives in `self`, which outlives the call.
            check(unsafe {
                libc::mount(
                    c"fk-agentd-hidden".as_ptr(),
                    cover.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,mode=0555".as_ptr().cast(),
                )
            })?;
        }
        // SAFETY: fork(2) in a single-threaded child; each side below makes plain system calls.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => first_process(),
            child => wait_and_exit_as(child),
        }
    }
}

/// The namespace's first process: dies with its parent, mounts the namespace's `/proc`.
fn first_process() -> io::Result<()> {
    // SAFETY: prctl and mount with integer arguments and valid C strings.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
        check(libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// Closes every descriptor but stdio (the spawner's exec-error pipe among them, so that its
/// `spawn` returns once the grandchild has exec'd), waits for `child` and ends as it did.
///
/// This process never execs, so it still holds the signal handlers of the process it was forked
/// from (the daemon's runtime, a test harness's SIGCHLD handler): they are reset first, or the
/// grandchild's exit would run such a handler here, on descriptors closed below (one aborted,
/// and the command's exit code was lost as SIGABRT).
fn wait_and_exit_as(child: libc::pid_t) -> ! {
    // SAFETY: signal(2), close_range(2), waitpid(2), raise(3) and _exit(2) with integer
    // arguments and a status word on this stack.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..4096 {
                libc::close(fd);
            }
        }
        let mut status = 0;
        loop {
            if libc::waitpid(child, &mut status, 0) == child {
                break;
            }
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
        libc::_exit(128 + sig)
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The folders to cover so that `hidden` (canonical paths) cannot be read: a hidden folder
/// itself, a hidden file's folder. Refused (with why) where a cover would take away what agent
/// code needs: the root, `$HOME`, or a folder holding a path of `reachable`.
pub fn covers(hidden: &[PathBuf], reachable: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let home = std::env::var_os("HOME").and_then(|h| Path::new(&h).canonicalize().ok());
    let mut out: Vec<PathBuf> = Vec::new();
    for h in hidden {
        let cover = if h.is_dir() {
            h.clone()
        } else {
            h.parent().unwrap_or(Path::new("/")).to_path_buf()
        };
        let needed = cover == Path::new("/")
            || home.as_ref().is_some_and(|home| home.starts_with(&cover))
            || reachable.iter().any(|r| {
                r.canonicalize()
                    .unwrap_or_else(|_| r.clone())
                    .starts_with(&cover)
            });
        if needed {
            return Err(format!(
                "without Landlock the whole folder {} would be hidden, and agent code needs it; keep the token in a folder of its own, e.g. ~/.config/fk-agentd/token",
                cover.display()
            ));
        }
        if !out.contains(&cover) {
            out.push(cover);
        }
    }
    // A folder under another cover is hidden with it (and could not be mounted on: the
    // cover above is empty).
    let all = out.clone();
    out.retain(|c| !all.iter().any(|o| o != c && c.starts_with(o)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_covered_by_its_folder_once_and_nested_covers_fold_into_the_outer() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let outer = root.join("secrets");
        let inner = outer.join("more");
        std::fs::create_dir_all(&inner).unwrap();
        for f in [outer.join("a"), outer.join("b"), inner.join("c")] {
            std::fs::write(f, "t").unwrap();
        }
        let hidden = [outer.join("a"), outer.join("b"), inner.join("c")];
        assert_eq!(covers(&hidden, &[]).unwrap(), vec![outer.clone()]);
        // A folder agent code needs is not covered: refused with why.
        let why = covers(&hidden, &[outer.join("runs")]).unwrap_err();
        assert!(why.contains("folder of its own"), "{why}");
    }
}
