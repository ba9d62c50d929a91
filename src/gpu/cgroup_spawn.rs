//! Starting a command directly inside a cgroup v2 with `clone3(CLONE_INTO_CGROUP)`, so no
//! process ever moves between cgroups and the kernel's global threadgroup lock is never taken.
//!
//! Why this exists: a v2 move (`echo 0 > cgroup.procs`) takes `cgroup_threadgroup_rwsem` for
//! writing, which waits an RCU grace period and stalls every concurrent fork on the host. With
//! 12 contending sessions on a 16-core H200 host that put the lease-grant p99 at 5.3–7 ms and,
//! paced, 29–38 ms. `CLONE_INTO_CGROUP` places the child at fork time under the read side.
//!
//! Owns the vfork-style clone and the child's few steps before `execve`; it does not own
//! choosing the cgroup, resolving the program on `PATH`, building the environment, or what the
//! broker does with the child (see the local backend).
//!
//! Invariants:
//! - The child shares the daemon's memory until it execs (`CLONE_VM | CLONE_VFORK`, like
//!   `posix_spawn`), so between clone and exec it runs on its own stack, allocates nothing,
//!   runs no signal handler of the daemon (all signals are blocked across the clone and the
//!   child's handlers are reset by `CLONE_CLEAR_SIGHAND`), and only makes plain system calls.
//! - Everything the child touches (paths, argv, envp, fds) is built by the parent beforehand and
//!   outlives the clone, because the calling thread is suspended until the child execs or exits.
//! - The child starts in a new process group with stdin, stdout and stderr from the caller, an
//!   empty signal mask and `SIGPIPE` at its default, as `std::process::Command` does.
//! - A failure before `execve` succeeds comes back as [`SpawnError::Exec`] with its errno and
//!   the child reaped; a refused clone is [`SpawnError::Clone`], so the caller can fall back;
//!   a lack of descriptors or memory before the clone is [`SpawnError::Resources`].
//! - The exit status is read through the child's pidfd, never `waitpid(-1)`, so other children
//!   of the daemon (tokio's) are not disturbed.
//!
//! Only x86-64 Linux has the clone path; elsewhere [`SUPPORTED`] is false and callers use the
//! shell trampoline.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use super::backend::{ExitInfo, LEASE_ID_ENV, LaunchSpec, resolve};
use super::types::LeaseError;

/// Whether this build has the clone path.
pub const SUPPORTED: bool = cfg!(all(target_os = "linux", target_arch = "x86_64"));

/// Why a spawn failed.
#[derive(Debug)]
pub enum SpawnError {
    /// `clone3` itself was refused (old kernel, seccomp, a cgroup that cannot take the child):
    /// nothing ran, and the caller may start the command another way.
    Clone(io::Error),
    /// The child could not become the command (`chdir`, `execve`…); it has been reaped.
    Exec(io::Error),
    /// What the spawn needs could not be had (descriptors, the child's stack); nothing ran.
    /// Unlike [`SpawnError::Clone`] this says nothing about whether the host allows the clone.
    Resources(io::Error),
}

/// What to start: every string already a C string, every path already resolved.
pub struct SpawnSpec<'a> {
    /// The executable to `execve` (the caller resolved it against `PATH`).
    pub program: &'a CStr,
    pub argv: &'a [CString],
    /// `NAME=value` entries: the child's whole environment.
    pub envp: &'a [CString],
    pub cwd: &'a CStr,
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    /// A directory fd of the cgroup v2 to start in; `None` starts in the daemon's own.
    pub cgroup: Option<BorrowedFd<'a>>,
    /// A Landlock ruleset the child enters before `execve` ([`crate::confine`]).
    pub confine: Option<BorrowedFd<'a>>,
}

/// A started child: its pid (also its process group id) and a pidfd to wait on.
#[derive(Debug)]
pub struct Child {
    pub pid: i32,
    pidfd: OwnedFd,
}

/// Starts `spec`'s command in a new process group, inside `spec.cgroup` when given.
pub fn spawn(spec: &SpawnSpec<'_>) -> Result<Child, SpawnError> {
    imp::spawn(spec)
}

/// Whether a child can be started straight into the cgroup v2 `dir` on this host: starts
/// `/bin/sh -c :` there and waits for it (about a millisecond). A refused clone (a kernel before
/// 5.7, a seccomp filter, a cgroup that cannot take processes) says no.
pub fn enters_directly(dir: &Path) -> bool {
    let (Ok(null), Ok(cgroup)) = (std::fs::File::open("/dev/null"), std::fs::File::open(dir))
    else {
        return false;
    };
    let argv = [c"sh".to_owned(), c"-c".to_owned(), c":".to_owned()];
    let spawned = spawn(&SpawnSpec {
        program: c"/bin/sh",
        argv: &argv,
        envp: &[],
        cwd: c"/",
        stdin: null.as_fd(),
        stdout: null.as_fd(),
        stderr: null.as_fd(),
        cgroup: Some(cgroup.as_fd()),
        confine: None,
    });
    match spawned {
        Ok(child) => reap(child.pidfd.as_fd()).is_ok(),
        // The child was in the cgroup when exec failed: the clone itself works.
        Err(SpawnError::Exec(_)) => true,
        Err(SpawnError::Clone(e) | SpawnError::Resources(e)) => {
            tracing::info!(dir = %dir.display(), error = %e, "a child cannot be started straight into this cgroup v2");
            false
        }
    }
}

/// Starts a lease's command in the cgroup v2 `dir` (`None`: the daemon's own), with what a
/// process-group lease gets: the daemon's environment less `env_remove`, plus `env` and the
/// lease-id tag; stdin from `/dev/null`; stdout and stderr to the lease's opened files.
/// `Ok(Err(_))`: the clone was refused and nothing ran.
pub fn launch_in(
    spec: &LaunchSpec<'_>,
    dir: Option<&Path>,
) -> Result<Result<Child, io::Error>, LeaseError> {
    let argv0 = spec.argv.first().cloned().unwrap_or_default();
    let spawn_err = LeaseError::spawn(&argv0);
    let program = resolve(&argv0, spec.cwd, &spec.env, spec.env_remove).map_err(spawn_err)?;
    let program = c_string(program.into_os_string().into_vec()).map_err(spawn_err)?;
    let argv = spec
        .argv
        .iter()
        .map(|a| c_string(a.clone().into_bytes()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(spawn_err)?;
    let envp = environment(spec).map_err(spawn_err)?;
    let cwd = c_string(spec.cwd.as_os_str().as_bytes().to_vec()).map_err(spawn_err)?;
    let open = |path: &Path| std::fs::File::open(path).map_err(LeaseError::io(path));
    let stdin = open(Path::new("/dev/null"))?;
    let cgroup = dir.map(open).transpose()?;
    let spawned = spawn(&SpawnSpec {
        program: &program,
        argv: &argv,
        envp: &envp,
        cwd: &cwd,
        stdin: stdin.as_fd(),
        stdout: spec.output.stdout.as_fd(),
        stderr: spec.output.stderr.as_fd(),
        cgroup: cgroup.as_ref().map(|c| c.as_fd()),
        // SAFETY: the broker's parameters hold the ruleset's descriptor open while it launches.
        confine: spec.confine.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) }),
    });
    match spawned {
        Ok(child) => Ok(Ok(child)),
        Err(SpawnError::Clone(e)) => Ok(Err(e)),
        Err(SpawnError::Exec(source) | SpawnError::Resources(source)) => Err(spawn_err(source)),
    }
}

/// The child's environment as `NAME=value` strings: the same rule as `backend::lease_command`
/// (the daemon's environment less `env_remove`, plus `env` and the lease-id tag).
fn environment(spec: &LaunchSpec<'_>) -> io::Result<Vec<CString>> {
    let mut vars: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for k in spec.env_remove {
        vars.remove(std::ffi::OsStr::new(k));
    }
    vars.extend(spec.env.iter().map(|(k, v)| (k.into(), v.into())));
    vars.insert(LEASE_ID_ENV.into(), spec.lease_id.into());
    vars.into_iter()
        .map(|(k, v)| {
            let mut entry = k.into_vec();
            entry.push(b'=');
            entry.extend(v.into_vec());
            c_string(entry)
        })
        .collect()
}

/// A C string, or the error `std::process::Command` gives for an interior NUL.
fn c_string(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

impl Child {
    /// Waits for the child to exit and reaps it.
    pub async fn wait(self) -> io::Result<ExitInfo> {
        // SAFETY: the AsyncFd owns the pidfd, which stays open and the same until it drops.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                self.pidfd,
                tokio::io::Interest::READABLE,
            )
        };
        match registered {
            Ok(fd) => {
                // A pidfd becomes readable once its process has exited.
                let _ready = fd.readable().await?;
                reap(fd.get_ref().as_fd())
            }
            // Without the reactor, wait on a blocking thread: the child must still be reaped.
            Err(e) => {
                let (fd, _) = e.into_parts();
                tokio::task::spawn_blocking(move || reap(fd.as_fd()))
                    .await
                    .map_err(io::Error::other)?
            }
        }
    }
}

/// Reaps the exited child behind `pidfd`, blocking until it has exited.
fn reap(pidfd: BorrowedFd<'_>) -> io::Result<ExitInfo> {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    loop {
        match waitid(WaitId::PidFd(pidfd), WaitIdOptions::EXITED) {
            Ok(Some(status)) => {
                return Ok(ExitInfo {
                    code: status.exit_status(),
                    signal: status.terminating_signal(),
                });
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A copy of `fd` numbered 3 or above, so that placing the child's stdio on 0–2 never
/// overwrites another of its sources (a daemon started with a closed stdin gets fd 0 back).
fn above_stdio(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a valid fd returns a new fd we then own.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use std::ffi::{CString, c_char};
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::ptr;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicI32, Ordering};

    use super::{Child, SpawnError, SpawnSpec, above_stdio, reap};

    const CLONE_VM: u64 = 0x0000_0100;
    const CLONE_VFORK: u64 = 0x0000_4000;
    const CLONE_PIDFD: u64 = 0x0000_1000;
    const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    /// The child's stack: its frames are a few hundred bytes, `execve` runs on the kernel's.
    const STACK_SIZE: usize = 64 * 1024;

    /// `struct clone_args` of `linux/sched.h`, up to `cgroup` (CLONE_ARGS_SIZE_VER2).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    /// What the child reads (all built by the parent) and the one thing it writes back.
    struct ChildCtx {
        program: *const c_char,
        argv: *const *const c_char,
        envp: *const *const c_char,
        cwd: *const c_char,
        stdio: [RawFd; 3],
        /// The Landlock ruleset to enter before exec; -1 for none.
        confine: RawFd,
        /// The errno of the step that failed; 0 while nothing has.
        errno: AtomicI32,
    }

    /// A mapped stack for the child. It is free again once the spawn returns (the child has
    /// exec'd or exited by then, so nothing runs on it any more) and goes back to [`STACKS`]
    /// rather than being unmapped: an `munmap` in the many-threaded daemon flushes the TLB of
    /// every CPU running one of its threads, once per spawn.
    struct Stack {
        base: *mut libc::c_void,
    }

    // SAFETY: a Stack is an exclusively owned mapping; only its owner's spawn uses it.
    unsafe impl Send for Stack {}

    /// Free child stacks, at most [`KEPT_STACKS`] (more than the leases that start at once).
    static STACKS: Mutex<Vec<Stack>> = Mutex::new(Vec::new());
    const KEPT_STACKS: usize = 32;

    impl Stack {
        /// A free stack from the pool, else a new mapping.
        fn take() -> io::Result<Self> {
            let kept = crate::sync::guard(&STACKS).pop();
            kept.map_or_else(Self::map, Ok)
        }

        /// Puts a stack whose child has exec'd or exited back in the pool.
        fn give_back(self) {
            let mut free = crate::sync::guard(&STACKS);
            if free.len() < KEPT_STACKS {
                free.push(self);
            }
        }

        fn map() -> io::Result<Self> {
            // SAFETY: an anonymous private mapping; failure is MAP_FAILED, checked below.
            let base = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    STACK_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            Ok(Self { base })
        }
    }

    impl Drop for Stack {
        fn drop(&mut self) {
            // SAFETY: `base` is our own mapping of STACK_SIZE bytes, unused by now.
            unsafe { libc::munmap(self.base, STACK_SIZE) };
        }
    }

    /// Blocks every signal on this thread until dropped, so no handler of the daemon runs in
    /// the child while it shares the daemon's memory.
    struct Masked {
        old: libc::sigset_t,
    }

    impl Masked {
        fn all() -> Self {
            // SAFETY: sigset_t is plain data; the calls only fill and install it.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
                Self { old }
            }
        }
    }

    impl Drop for Masked {
        fn drop(&mut self) {
            // SAFETY: restores the mask saved by `all`.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, ptr::null_mut()) };
        }
    }

    fn pointers(strings: &[CString]) -> Vec<*const c_char> {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(ptr::null()))
            .collect()
    }

    pub(super) fn spawn(spec: &SpawnSpec<'_>) -> Result<Child, SpawnError> {
        let lacking = SpawnError::Resources;
        let stdio = [
            above_stdio(spec.stdin).map_err(lacking)?,
            above_stdio(spec.stdout).map_err(lacking)?,
            above_stdio(spec.stderr).map_err(lacking)?,
        ];
        let argv = pointers(spec.argv);
        let envp = pointers(spec.envp);
        let ctx = ChildCtx {
            program: spec.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: spec.cwd.as_ptr(),
            stdio: stdio.each_ref().map(|fd| fd.as_raw_fd()),
            confine: spec.confine.map_or(-1, |fd| fd.as_raw_fd()),
            errno: AtomicI32::new(0),
        };
        let stack = Stack::take().map_err(lacking)?;
        let mut pidfd: RawFd = -1;
        let mut args = CloneArgs {
            flags: CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_CLEAR_SIGHAND,
            pidfd: ptr::addr_of_mut!(pidfd) as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: stack.base as u64,
            stack_size: STACK_SIZE as u64,
            ..CloneArgs::default()
        };
        if let Some(cg) = spec.cgroup {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = cg.as_raw_fd() as u64;
        }
        let ret = {
            let _masked = Masked::all();
            // SAFETY: `args`, `ctx` and everything they point to live until the call returns,
            // which with CLONE_VFORK is after the child has exec'd or exited; the child runs
            // `child_main` on `stack` and never returns into this frame.
            unsafe { clone3_vfork(&mut args, &ctx) }
        };
        stack.give_back();
        if ret < 0 {
            return Err(SpawnError::Clone(io::Error::from_raw_os_error(-ret as i32)));
        }
        // SAFETY: CLONE_PIDFD stored a new pidfd that only we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let child = Child {
            pid: ret as i32,
            pidfd,
        };
        match ctx.errno.load(Ordering::Acquire) {
            0 => Ok(child),
            errno => {
                let _ = reap(std::os::fd::AsFd::as_fd(&child.pidfd));
                Err(SpawnError::Exec(io::Error::from_raw_os_error(errno)))
            }
        }
    }

    /// `clone3` with the child switching to `child_main(ctx)` on its own stack. Returns the
    /// child's pid, or `-errno`.
    ///
    /// # Safety
    /// `args` must describe a valid mapped stack, and `ctx` must stay valid until this returns.
    unsafe fn clone3_vfork(args: &mut CloneArgs, ctx: &ChildCtx) -> isize {
        let ret: isize;
        // SAFETY: the parent path is a plain syscall (the kernel clobbers rax, rcx, r11). The
        // child resumes after `syscall` with rax = 0 and rsp at the top of its stack (16-byte
        // aligned, as mmap returns pages), then calls `child_main`, which never returns.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone3 as isize => ret,
                in("rdi") args as *mut CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") ctx as *const ChildCtx,
                in("r13") child_main as extern "C" fn(*const ChildCtx) -> !,
                lateout("rcx") _,
                lateout("r11") _,
            );
        }
        ret
    }

    /// Reports the errno of the step that just failed and ends the child.
    ///
    /// # Safety
    /// Only for the child, right after a failed libc call.
    unsafe fn fail(ctx: &ChildCtx) -> ! {
        // SAFETY: errno is this (shared) thread's; the failed call just set it.
        let e = unsafe { *libc::__errno_location() };
        ctx.errno
            .store(if e == 0 { libc::EIO } else { e }, Ordering::Release);
        // SAFETY: ends only the child; nothing of the parent's is flushed or freed.
        unsafe { libc::_exit(127) }
    }

    /// The child between clone and exec: new process group, stdio, working directory, default
    /// SIGPIPE, empty mask, the Landlock ruleset when given, `execve`. Plain libc calls only (no allocation, no locks); errno
    /// lives in the suspended parent thread's TLS, which nothing reads until we are done.
    extern "C" fn child_main(ctx: *const ChildCtx) -> ! {
        // SAFETY: the parent keeps `ctx` alive while suspended by CLONE_VFORK.
        let ctx = unsafe { &*ctx };
        // SAFETY: each call is a thin system-call wrapper on values the parent prepared.
        unsafe {
            if libc::setpgid(0, 0) != 0 {
                fail(ctx);
            }
            for (target, fd) in ctx.stdio.iter().enumerate() {
                if libc::dup2(*fd, target as i32) < 0 {
                    fail(ctx);
                }
            }
            if libc::chdir(ctx.cwd) != 0 {
                fail(ctx);
            }
            // The daemon ignores SIGPIPE (Rust does); a command expects the default.
            if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
                fail(ctx);
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            if libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut()) != 0 {
                fail(ctx);
            }
            // Plain prctl and Landlock system calls, acting on this task only.
            if ctx.confine >= 0 && crate::confine::enter(ctx.confine).is_err() {
                fail(ctx);
            }
            libc::execve(ctx.program, ctx.argv, ctx.envp);
            fail(ctx)
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod imp {
    use super::{Child, SpawnError, SpawnSpec};

    pub(super) fn spawn(_spec: &SpawnSpec<'_>) -> Result<Child, SpawnError> {
        Err(SpawnError::Clone(std::io::Error::from_raw_os_error(
            libc::ENOSYS,
        )))
    }
}
