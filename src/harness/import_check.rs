//! The candidate import check, run before every real validate and bench: a Python subprocess
//! imports the baseline module from the patched copy, then loads the candidate file by path and
//! looks for the baseline's classes. The real bench swallows every exception while loading a
//! candidate and reports "no candidate class found" as SKIPPED with exit 0 (a syntax error
//! looks like a clean run), so the traceback from here is what the agent gets to see. The
//! candidate's top level is agent-written code: it runs under the campaign's confinement
//! ([`crate::confine`]) with an allowlisted environment, like the agent's shell.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::target::TargetId;

/// How to run the check.
#[derive(Clone, Debug)]
pub struct ImportCheck {
    /// The Python argv prefix (the first word of `fastkernels.command`).
    pub python: Vec<String>,
    /// The patched fastkernels copy (its folder holds the `fastkernels` package).
    pub harness: PathBuf,
    pub timeout: Duration,
    /// The whole environment of the check (an allowlist built at the edge: `PATH`, `LANG`,
    /// `HOME`, library paths). Nothing else of the daemon's environment, no provider token.
    pub env: Vec<(String, String)>,
    /// The ruleset agent code runs under (the candidate's top level runs here): the provider's
    /// token file is out of its reach, as from the agent's shell and the leases.
    pub confinement: crate::confine::Confinement,
}

/// The variables an import check may inherit from the daemon, by name.
pub const INHERITED: &[&str] = &[
    "PATH",
    "LANG",
    "LC_ALL",
    "HOME",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    // Which Python and packages `python3` is: a virtual environment, conda, pyenv.
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYENV_ROOT",
    "PYENV_VERSION",
];

const SCRIPT: &str = r#"
import importlib, importlib.util, sys, traceback
level, stem, path, classes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
try:
    importlib.import_module("fastkernels.tasks.baseline.%s.%s" % (level, stem))
except Exception:
    print("the baseline module itself does not import here (not your candidate's fault):")
    traceback.print_exc(file=sys.stdout)
    sys.exit(3)
try:
    spec = importlib.util.spec_from_file_location("_fk_agentd_import_check_%s_%s" % (level, stem), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
except BaseException:
    print("the candidate does not load:")
    traceback.print_exc(file=sys.stdout)
    sys.exit(1)
missing = [c for c in classes if not isinstance(getattr(module, c, None), type)]
if len(missing) == len(classes):
    print("no candidate class found: the file defines no class named " + ", ".join(missing))
    sys.exit(1)
print("ok" + (" skipped " + ",".join(missing) if missing else ""))
"#;

/// The verdict of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportVerdict {
    /// It loads and defines at least one of the classes; `skipped` are those it does not
    /// define (the bench runs the baseline's there, as it does).
    Ok { skipped: Vec<String> },
    /// The candidate fails to load or lacks a class: the text (traceback) is for the agent.
    Candidate(String),
    /// The baseline or Python itself failed: not the agent's fault.
    Infrastructure(String),
}

impl ImportCheck {
    pub async fn run(
        &self,
        target: &TargetId,
        candidate: &Path,
        classes: &[String],
    ) -> ImportVerdict {
        let Some((program, pre)) = self.python.split_first() else {
            return ImportVerdict::Infrastructure("no python command configured".into());
        };
        let mut cmd = Command::new(program);
        cmd.args(pre)
            .arg("-c")
            .arg(SCRIPT)
            .arg(target.level_dir())
            .arg(target.stem())
            .arg(candidate)
            .arg(classes.join(","))
            .current_dir(&self.harness)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .kill_on_drop(true);
        self.confinement.apply(&mut cmd);
        let out = match tokio::time::timeout(self.timeout, cmd.output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                return ImportVerdict::Infrastructure(format!("cannot run {program}: {e}"));
            }
            Err(_) => {
                return ImportVerdict::Candidate(format!(
                    "importing the candidate did not finish within {} s (does it run work at import time?)",
                    self.timeout.as_secs()
                ));
            }
        };
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                let skipped = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("ok skipped "))
                    .map(|s| s.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                ImportVerdict::Ok { skipped }
            }
            Some(1) => ImportVerdict::Candidate(text.trim().to_string()),
            _ => ImportVerdict::Infrastructure(text.trim().to_string()),
        }
    }
}
