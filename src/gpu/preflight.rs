//! Request checks before anything is queued: shape, limits, the environment it asks for, that
//! its program would start (a missing `ncu` or `nsys` is the host's lack, exit 3; any other
//! missing program is bad input, exit 2), and `ncu`'s profiler permission.

use super::broker::Broker;
use super::inventory::InventorySource;
use super::types::{LeaseClass, LeaseCommand, LeaseError, LeaseRequest};

/// Variables the broker sets in every lease's environment: a request may not set them (one
/// naming other GPUs than the lease's would escape it until the NVML audit saw it).
const RESERVED_ENV: [&str; 3] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    super::backend::LEASE_ID_ENV,
];

/// True when `argv0` names the profiler of an `ncu` or `nsys` lease (by its file name).
fn is_profiler(class: LeaseClass, argv0: &str) -> bool {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(argv0);
    matches!(
        (class, name),
        (LeaseClass::Ncu, "ncu") | (LeaseClass::Nsys, "nsys")
    )
}

impl Broker {
    /// Checks a request without queueing it: shape, limits, and the class preflights.
    pub fn check(&self, req: &LeaseRequest, cmd: &LeaseCommand) -> Result<(), LeaseError> {
        let p = &self.inner.params;
        let total = self.inner.inventory.len();
        if req.gpus == 0 {
            return Err(LeaseError::bad("gpus", 0, "at least 1"));
        }
        if req.gpus as usize > total {
            return Err(LeaseError::bad(
                "gpus",
                req.gpus,
                format!("at most {total} (the GPUs of this node)"),
            ));
        }
        if req.max_run.is_zero() || req.max_run > p.lease_timeout {
            // Exact, so that 600.5 s against a 10m limit does not read as `10m`.
            let exact = |d: std::time::Duration| humantime::format_duration(d).to_string();
            return Err(LeaseError::bad(
                "timeout",
                exact(req.max_run),
                format!(
                    "more than 0 and at most the lease timeout ({})",
                    exact(p.lease_timeout)
                ),
            ));
        }
        if req.session.trim().is_empty() {
            return Err(LeaseError::bad("session", "", "a session name"));
        }
        if cmd.argv.first().is_none_or(|a| a.is_empty()) {
            return Err(LeaseError::bad(
                "command",
                format!("{:?}", cmd.argv),
                "a command to run",
            ));
        }
        if let Some((name, _)) = cmd.env.iter().find(|(k, _)| {
            RESERVED_ENV.contains(&k.as_str()) || p.env_remove.iter().any(|r| r == k)
        }) {
            return Err(LeaseError::bad(
                "env",
                name,
                format!(
                    "a variable the broker leaves alone (it sets {} itself, and keeps secrets out)",
                    RESERVED_ENV.join(", ")
                ),
            ));
        }
        self.check_program(req, cmd)
    }

    /// Checks that the program would start and, for `ncu`, that its counters may be read.
    fn check_program(&self, req: &LeaseRequest, cmd: &LeaseCommand) -> Result<(), LeaseError> {
        let argv0 = &cmd.argv[0];
        let p = &self.inner.params;
        let program = self
            .inner
            .backend
            .check_program(argv0, &cmd.cwd, &cmd.env, &p.env_remove);
        match program {
            // The profiler itself missing is the host's lack; any other program is the
            // request's.
            Err(u) if u.missing && is_profiler(req.class, argv0) => Err(LeaseError::ToolMissing {
                class: req.class.as_str(),
                tool: argv0.clone(),
                why: u.why,
            }),
            Err(u) => Err(LeaseError::bad(
                "command",
                argv0,
                format!("a program that can be run; it {}", u.why),
            )),
            Ok(()) if req.class == LeaseClass::Ncu => self.profiler_preflight(),
            Ok(()) => Ok(()),
        }
    }

    /// `ERR_NVGPUCTRPERM` before it happens: the driver restricts counters to admins.
    fn profiler_preflight(&self) -> Result<(), LeaseError> {
        let p = &self.inner.params;
        if p.is_root || self.inner.inventory.source != InventorySource::Nvml {
            return Ok(());
        }
        let Ok(text) = std::fs::read_to_string(&p.nvidia_params) else {
            return Ok(());
        };
        if text
            .lines()
            .any(|l| l.replace(' ', "") == "RmProfilingAdminOnly:1")
        {
            return Err(LeaseError::ProfilerPermission {
                detail: format!("{} has RmProfilingAdminOnly: 1", p.nvidia_params.display()),
            });
        }
        Ok(())
    }
}
