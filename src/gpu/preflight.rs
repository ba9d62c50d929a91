//! Request checks before anything is queued: shape, limits, and the class preflights (`ncu`
//! needs profiler permission and its binary, `nsys` its binary).

use std::path::Path;

use super::broker::Broker;
use super::inventory::InventorySource;
use super::types::{LeaseClass, LeaseCommand, LeaseError, LeaseRequest};

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
            return Err(LeaseError::bad(
                "timeout",
                crate::config::format_duration(req.max_run),
                format!(
                    "more than 0 and at most the lease timeout ({})",
                    crate::config::format_duration(p.lease_timeout)
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
        match req.class {
            LeaseClass::Ncu => {
                self.require_tool(req.class, &cmd.argv[0], &cmd.cwd)?;
                self.profiler_preflight()
            }
            LeaseClass::Nsys => self.require_tool(req.class, &cmd.argv[0], &cmd.cwd),
            LeaseClass::Validate | LeaseClass::Bench => Ok(()),
        }
    }

    fn require_tool(&self, class: LeaseClass, argv0: &str, cwd: &Path) -> Result<(), LeaseError> {
        let found = if argv0.contains('/') {
            cwd.join(argv0).is_file()
        } else if self.inner.params.search_path.is_empty() {
            // No search path was given (the caller did not pass PATH): nothing to check against.
            true
        } else {
            self.inner
                .params
                .search_path
                .iter()
                .any(|d| d.join(argv0).is_file())
        };
        if found {
            return Ok(());
        }
        let searched = self
            .inner
            .params
            .search_path
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        Err(LeaseError::ToolMissing {
            class: class.as_str(),
            tool: argv0.to_string(),
            searched,
        })
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
        let restricted = text.lines().any(|l| {
            let l = l.replace(' ', "");
            l == "RmProfilingAdminOnly:1"
        });
        if restricted {
            return Err(LeaseError::ProfilerPermission {
                detail: format!("{} has RmProfilingAdminOnly: 1", p.nvidia_params.display()),
            });
        }
        Ok(())
    }
}
