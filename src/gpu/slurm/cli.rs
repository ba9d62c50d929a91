//! The Slurm commands as the backend calls them (`sbatch`, `srun`, `squeue`, `scancel`,
//! `scontrol`, `sinfo`), and the parsers of their `--parsable`/`-o` output.
//!
//! Every command gets `SLURM_CONF` from the config (when set) and none of the daemon's secret
//! variables. Parsers are pure functions, tested on text captured from Slurm 22.05.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// How to run the Slurm commands.
#[derive(Clone, Debug, Default)]
pub struct SlurmCli {
    /// `SLURM_CONF` for every command; `None` keeps Slurm's default.
    pub conf: Option<PathBuf>,
    /// Variables removed from every command's environment (the provider token's).
    pub env_remove: Vec<String>,
}

impl SlurmCli {
    /// The commands of `cfg`'s cluster, without the variables `env_remove` names.
    pub fn new(cfg: &crate::config::SlurmConfig, env_remove: &[String]) -> Self {
        SlurmCli {
            conf: cfg.conf.clone(),
            env_remove: env_remove.to_vec(),
        }
    }

    /// `sinfo -h -N -o FORMAT` (of `partition` when given): one row per node.
    pub fn sinfo_nodes(&self, partition: Option<&str>, format: &str) -> Result<String, String> {
        let mut args = vec!["-h".into(), "-N".into(), "-o".into(), format.into()];
        args.extend(partition.map(|p| format!("--partition={p}")));
        self.run("sinfo", &args)
    }

    /// A command with the cluster's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for k in &self.env_remove {
            cmd.env_remove(k);
        }
        if let Some(conf) = &self.conf {
            cmd.env("SLURM_CONF", conf);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Runs `program args…`; its stdout, or an error naming the command and its stderr.
    pub fn run(&self, program: &str, args: &[String]) -> Result<String, String> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run `{program}`: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`{program} {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// What Slurm's accounting recorded for the step named `name` of job `holder`, or for the
    /// job named `name` when `holder` is `None`: `(id, state, exit code field, node)` rows,
    /// newest last. An error where accounting is off (`sacct` then refuses).
    pub fn accounted(
        &self,
        holder: Option<u64>,
        name: &str,
    ) -> Result<Vec<(String, String, String, String)>, String> {
        let mut args: Vec<String> = ["-n", "-P", "-o", "JobID,JobName,State,ExitCode,NodeList"]
            .map(String::from)
            .to_vec();
        match holder {
            Some(job) => args.push(format!("--jobs={job}")),
            // Without a job id sacct looks from midnight on; a lease is never that old here.
            None => args.extend([
                "-X".into(),
                format!("--name={name}"),
                "-S".into(),
                "now-7days".into(),
            ]),
        }
        let out = self.run("sacct", &args)?;
        Ok(parse_rows(&out, 5)
            .into_iter()
            .filter(|r| r[1] == name)
            .map(|r| (r[0].clone(), r[2].clone(), r[3].clone(), r[4].clone()))
            .collect())
    }

    /// `squeue -h FILTER… -o FORMAT`, as rows of FORMAT's `|`-separated fields.
    pub(super) fn squeue(
        &self,
        filter: &[String],
        format: &str,
    ) -> Result<Vec<Vec<String>>, String> {
        let mut args = vec!["-h".to_string()];
        args.extend_from_slice(filter);
        args.extend(["-o".into(), format.into()]);
        Ok(parse_rows(
            &self.run("squeue", &args)?,
            format.split('|').count(),
        ))
    }

    /// The state squeue lists for job `id`; `None` once squeue no longer knows it.
    pub fn job_state(&self, id: u64) -> Result<Option<String>, String> {
        match self.squeue(&[format!("--jobs={id}")], "%T") {
            Ok(rows) => Ok(rows.into_iter().next().map(|mut r| r.swap_remove(0))),
            Err(e) if e.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// How job `id`'s allocation ended as accounting recorded it (e.g. `NODE_FAIL` for a
    /// job requeued after its node failed); `None` while it never ended.
    pub fn accounted_state(&self, id: u64) -> Result<Option<String>, String> {
        let args = ["-n", "-P", "-X", "-o", "State", &format!("--jobs={id}")].map(String::from);
        let out = self.run("sacct", &args)?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .find(|s| recorded_end(s, "0:0").is_some())
            .map(String::from))
    }

    /// The running steps of `job`, as `(step id "J.S", step name, node)`.
    pub fn steps_of(&self, job: u64) -> Result<Vec<(String, String, String)>, String> {
        Ok(self
            .squeue(&["-s".into(), format!("--jobs={job}")], "%i|%j|%N")?
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
            .collect())
    }

    /// Jobs matching `filter`, as `(job id, state, node)`.
    fn jobs(&self, filter: &[String]) -> Result<Vec<(u64, String, String)>, String> {
        Ok(self
            .squeue(filter, "%i|%T|%N")?
            .into_iter()
            .filter_map(|r| Some((r[0].parse().ok()?, r[1].clone(), r[2].clone())))
            .collect())
    }

    /// Jobs named `name` of any state squeue still lists, as `(job id, state, node)`.
    pub fn jobs_named(&self, name: &str) -> Result<Vec<(u64, String, String)>, String> {
        self.jobs(&[format!("--name={name}")])
    }

    /// GPUs asked per node by each job named `name` (`squeue %b`: `gres:gpu:4`,
    /// `gres/gpu:h200:4`), as `(job id, state, gpus)`; a job that asks none reads as 0.
    pub fn gpus_of_jobs_named(&self, name: &str) -> Result<Vec<(u64, String, u32)>, String> {
        Ok(self
            .squeue(&[format!("--name={name}")], "%i|%T|%b")?
            .into_iter()
            .filter_map(|r| Some((r[0].parse().ok()?, r[1].clone(), gres_gpus(&r[2]))))
            .collect())
    }

    /// The newest job named `name` that slurmctld still remembers, ended ones included (for
    /// `MinJobAge` after their end), as `(job id, state, node)`.
    pub fn newest_job_named(&self, name: &str) -> Result<Option<(u64, String, String)>, String> {
        Ok(self
            .jobs(&["--states=all".into(), format!("--name={name}")])?
            .into_iter()
            .max_by_key(|r| r.0))
    }

    /// `scancel` with `args` (e.g. `--signal=TERM 12.3`); a job or step that is already gone
    /// is no error.
    pub fn scancel(&self, args: &[String]) -> Result<(), String> {
        match self.run("scancel", &[&["--quiet".to_string()], args].concat()) {
            Ok(_) => Ok(()),
            Err(e) if e.contains("Invalid job id") || e.contains("already completing") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// GPUs in a gres text (`gres:gpu:4`, `gres/gpu:h200:2`, `gpu:1`); 0 when it names none.
pub fn gres_gpus(text: &str) -> u32 {
    text.split(',')
        .filter(|g| g.contains("gpu"))
        .filter_map(|g| g.split('(').next()?.rsplit(':').next()?.parse::<u32>().ok())
        .sum()
}

/// `|`-separated rows with at least `fields` fields; blank lines skipped.
pub fn parse_rows(text: &str, fields: usize) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.split('|').map(str::to_string).collect::<Vec<_>>())
        .filter(|r| r.len() >= fields)
        .collect()
}

/// The node and GPU indices of a one-node job, from `scontrol show job -d` text
/// (`Nodes=n2 CPU_IDs=2 Mem=0 GRES=gpu:1(IDX:2)`).
pub fn job_gpus(text: &str) -> Option<(String, Vec<u32>)> {
    for line in text.lines() {
        let line = line.trim();
        let (Some(nodes), Some(gres)) = (field(line, "Nodes="), field(line, "GRES=")) else {
            continue;
        };
        let idx = gres.split("IDX:").nth(1)?.trim_end_matches(')');
        return Some((nodes.to_string(), parse_index_list(idx)?));
    }
    None
}

/// The value of `key` in a line of space-separated `Key=value` pairs.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key))
}

/// `0-2,5` → `[0, 1, 2, 5]`.
pub fn parse_index_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// GPUs per node from `sinfo -h -N -o '%N|%G|%T'` rows (`n1|gpu:4|idle`): `(node, gpus,
/// state)`.
pub fn node_gpus(text: &str) -> Vec<(String, u32, String)> {
    parse_rows(text, 3)
        .into_iter()
        .map(|r| {
            let gpus = r[1]
                .split(',')
                .find_map(|g| g.strip_prefix("gpu:"))
                .map(|g| {
                    // `gpu:4`, `gpu:h200:8` or `gpu:8(S:0-1)`.
                    let g = g.split('(').next().unwrap_or(g);
                    g.rsplit(':').next().unwrap_or(g).parse().unwrap_or(0)
                })
                .unwrap_or(0);
            (r[0].clone(), gpus, r[2].clone())
        })
        .collect()
}

/// `(node, state, reason)` from `sinfo -h -N -o '%N|%T|%E'` rows, one per node (a node in
/// several partitions is listed once per partition).
pub fn node_states(text: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for r in parse_rows(text, 3) {
        if !out.iter().any(|(n, ..)| *n == r[0]) {
            out.push((r[0].clone(), r[1].clone(), r[2..].join("|")));
        }
    }
    out
}

/// A recorded end from an accounting row's state and `ExitCode` field (`code:signal`):
/// `None` while the job or step has not ended (running, pending, or not yet recorded).
pub fn recorded_end(state: &str, exit: &str) -> Option<(Option<i32>, Option<i32>)> {
    // "CANCELLED by 0" and the like: the first word is the state.
    let state = state.split_whitespace().next().unwrap_or("");
    if matches!(
        state,
        "" | "PENDING" | "RUNNING" | "REQUEUED" | "RESIZING" | "SUSPENDED" | "COMPLETING"
    ) {
        return None;
    }
    let (code, signal) = exit.split_once(':').unwrap_or((exit, "0"));
    let code = code.parse::<i32>().ok();
    let signal = signal.parse::<i32>().ok().filter(|&s| s != 0);
    Some((if signal.is_some() { None } else { code }, signal))
}

/// Whether a node in `state` (sinfo's `%T`) cannot run work: down, drained or draining,
/// failing, invalid, or not responding (`*`). Running steps on a draining node would finish,
/// but the broker's deadline is not Slurm's: such a lease ends now, as the infrastructure's.
pub fn unusable(state: &str) -> bool {
    let s = state.to_ascii_lowercase();
    s.ends_with('*')
        || ["down", "drain", "fail", "inval"]
            .iter()
            .any(|w| s.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_jobs_node_and_gpu_are_read_from_scontrol() {
        let text = "JobId=7 JobName=fk-agentd-hold\n   NumNodes=1 NumCPUs=1\n   JOB_GRES=gpu:1\n     Nodes=n2 CPU_IDs=2 Mem=0 GRES=gpu:1(IDX:2)\n   TresPerNode=gres:gpu:1\n";
        assert_eq!(job_gpus(text), Some(("n2".into(), vec![2])));
        assert_eq!(
            job_gpus("     Nodes=gpu-07 CPU_IDs=0-3 Mem=0 GRES=gpu:h200:3(IDX:0-1,5)"),
            Some(("gpu-07".into(), vec![0, 1, 5]))
        );
        assert_eq!(job_gpus("   JOB_GRES=(null)"), None);
    }

    #[test]
    fn a_jobs_gpus_are_read_from_its_gres() {
        for (text, gpus) in [
            ("gres:gpu:4", 4),
            ("gres/gpu:h200:2", 2),
            ("gpu:1", 1),
            ("gpu:h200:8(S:0-1)", 8),
            ("N/A", 0),
            ("(null)", 0),
        ] {
            assert_eq!(gres_gpus(text), gpus, "{text}");
        }
    }

    #[test]
    fn sinfo_rows_give_gpus_per_node() {
        let rows = node_gpus("n1|gpu:4|idle\nn2|gpu:h200:8(S:0-1)|mixed\nn3|(null)|down*\n");
        assert_eq!(
            rows,
            vec![
                ("n1".into(), 4, "idle".into()),
                ("n2".into(), 8, "mixed".into()),
                ("n3".into(), 0, "down*".into()),
            ]
        );
    }

    #[test]
    fn accounting_rows_give_an_end_only_once_the_step_has_ended() {
        assert_eq!(recorded_end("COMPLETED", "0:0"), Some((Some(0), None)));
        assert_eq!(recorded_end("FAILED", "3:0"), Some((Some(3), None)));
        assert_eq!(recorded_end("CANCELLED by 0", "0:9"), Some((None, Some(9))));
        assert_eq!(
            recorded_end("OUT_OF_MEMORY", "0:125"),
            Some((None, Some(125)))
        );
        assert_eq!(recorded_end("NODE_FAIL", "garbage"), Some((None, None)));
        for live in ["RUNNING", "PENDING", "COMPLETING", ""] {
            assert_eq!(recorded_end(live, "0:0"), None, "{live}");
        }
    }

    #[test]
    fn rows_shorter_than_asked_are_dropped() {
        assert_eq!(
            parse_rows("7.0|lease-1|n2\n\nbroken\n", 3),
            vec![vec!["7.0".to_string(), "lease-1".into(), "n2".into()]]
        );
    }

    #[test]
    fn drained_down_and_silent_nodes_are_unusable() {
        let rows =
            node_states("n1|draining|test\nn2|idle|none\nn2|idle|none\nn3|down*|Not responding\n");
        assert_eq!(
            rows,
            vec![
                ("n1".into(), "draining".into(), "test".into()),
                ("n2".into(), "idle".into(), "none".into()),
                ("n3".into(), "down*".into(), "Not responding".into()),
            ]
        );
        let verdicts: Vec<bool> = [
            "idle",
            "mixed",
            "allocated",
            "completing",
            "drained",
            "draining",
            "down",
            "down*",
            "idle*",
            "fail",
            "inval",
            "mixed-",
        ]
        .iter()
        .map(|s| unusable(s))
        .collect();
        assert_eq!(
            verdicts,
            [
                false, false, false, false, true, true, true, true, true, true, true, false
            ]
        );
    }
}
