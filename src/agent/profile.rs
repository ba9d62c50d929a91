//! The profiling tools of a real session: `ncu` and `nsys` around this target's bench, each
//! under its own lease class (caps and profiler checks are the broker's). An ncu run that
//! profiled nothing is an error the agent sees, with the names of the kernels that did run,
//! because a filter that matches nothing otherwise looks like a quiet success.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::gpu::{Broker, LeaseClass, LeaseCommand, LeaseRequest};
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, Invocation};
use crate::tools::{ToolError, ToolOutput};
use crate::workspace::Workspace;
use crate::workspace::truncate_output;

const NOTHING_PROFILED: &str = "No kernels were profiled";
/// ncu around every process of the bench, the GPU's clocks left as they are.
const NCU: [&str; 5] = [
    "ncu",
    "--target-processes",
    "all",
    "--clock-control",
    "none",
];

/// Runs `argv` (a profiler around the profile's bench) under its lease class in `work`; its output.
async fn leased<L: BenchLauncher>(
    p: &ProfileParams<'_, L>,
    profile: &Profile,
    argv: Vec<String>,
    work: &Path,
) -> Result<(Option<i32>, String), ToolError> {
    let (driver, broker, cancel) = (p.driver, p.broker, p.cancel);
    let (class, inv) = (profile.class, &profile.inv);
    let tool = class.as_str();
    let infra = |why: String| ToolError::infra(tool, why, true);
    std::fs::create_dir_all(work)
        .map_err(|e| infra(format!("cannot create {}: {e}", work.display())))?;
    let tag = work
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let req = LeaseRequest {
        class,
        gpus: 1,
        max_run: driver.params().deadline,
        session: inv
            .env
            .iter()
            .find(|(k, _)| k == "FK_AGENTD_SESSION")
            .map(|(_, v)| v.clone())
            .unwrap_or_default(),
        idempotency_key: format!("{tool}-{tag}-{}", argv.len()),
        node: None,
    };
    let cmd = LeaseCommand {
        argv,
        cwd: inv.cwd.clone().unwrap_or_else(|| work.to_path_buf()),
        env: inv.env.clone(),
        stdout: work.join(format!("{tool}.stdout")),
        stderr: work.join(format!("{tool}.stderr")),
    };
    let out = broker
        .run(req, cmd, cancel)
        .await
        .map_err(|e| infra(e.to_string()))?;
    if out.infra {
        let why = format!("lease {} failed for infrastructure reasons", out.lease_id);
        return Err(infra(why));
    }
    let text = std::fs::read_to_string(&out.stdout).unwrap_or_default()
        + &std::fs::read_to_string(&out.stderr).unwrap_or_default();
    Ok((out.exit_code, text))
}

fn with_bench(mut argv: Vec<String>, inv: &Invocation) -> Vec<String> {
    argv.push(inv.program.clone());
    argv.extend(inv.args.iter().cloned());
    argv
}

/// What a profiling call needs: the session's bench driver, the broker and the workspace.
pub struct ProfileParams<'a, L> {
    pub driver: &'a BenchDriver<L>,
    pub broker: &'a Broker,
    pub ws: &'a Workspace,
    /// Numbers the profile folder (`profiles/<n>-<tool>/`).
    pub n: u32,
    pub cancel: &'a CancellationToken,
}

/// One profiling call: its profiler's lease class, its private folder and the bench
/// invocation it wraps.
struct Profile {
    class: LeaseClass,
    work: std::path::PathBuf,
    inv: Invocation,
}

impl<L: BenchLauncher> ProfileParams<'_, L> {
    /// The profile of this call with the profiler of `class`.
    fn prepare(&self, class: LeaseClass) -> Profile {
        let work = self.ws.session_dir().join("profiles").join(format!(
            "{:03}-{}",
            self.n,
            class.as_str()
        ));
        let ws = self.ws;
        let req = BenchRequest::target(ws.target(), ws.candidate_root(), &work)
            .for_session(&ws.target().to_string(), &ws.cache_dir());
        let inv = self.driver.invocation(&req);
        Profile { class, work, inv }
    }
}

/// The short names (what ncu's `-k` matches by default) of the kernels in ncu's per-kernel
/// headers (`name(args) (grid)x(block), Context …`), in order of first appearance.
pub fn kernel_names(ncu_output: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in ncu_output.lines() {
        if !line.contains(", Context ") || !line.contains(", Device ") {
            continue;
        }
        let name = short_name(line.trim());
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// `void at::native::vectorized_elementwise_kernel<4, F(…)::{lambda(float)#1}>(int, T2) (…)x(…)`
/// → `vectorized_elementwise_kernel`: drop the return type, template arguments, parameters and
/// namespaces. Brackets nest, and `<unnamed>` namespaces count as brackets (then dropped too).
fn short_name(header: &str) -> String {
    let head = header.strip_prefix("void ").unwrap_or(header);
    // A space at depth 0 ends a return type, unless the parameter list or grid follows it.
    let (mut angle, mut out, mut after_space) = (0usize, String::new(), false);
    for c in head.chars() {
        match c {
            '<' => angle += 1,
            '>' => angle = angle.saturating_sub(1),
            '(' if angle == 0 => break,
            ' ' if angle == 0 => after_space = true,
            _ if angle == 0 => {
                if std::mem::take(&mut after_space) {
                    out.clear();
                }
                out.push(c);
            }
            _ => {}
        }
    }
    out.rsplit("::").next().unwrap_or("").to_string()
}

/// `profile_ncu {args}`: Nsight Compute around the bench, the report kept in the session.
pub async fn ncu<L: BenchLauncher>(
    p: &ProfileParams<'_, L>,
    args: Option<String>,
) -> Result<ToolOutput, ToolError> {
    let profile = p.prepare(LeaseClass::Ncu);
    let user: Vec<String> = args
        .unwrap_or_else(|| "-c 5".into())
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if user
        .iter()
        .any(|a| a == "-o" || a == "--export" || a.starts_with("--export="))
    {
        return Ok(ToolOutput::error(
            "profile_ncu: do not pass -o/--export; the report path is chosen for you",
        ));
    }
    let report = profile.work.join("report");
    let mut argv = NCU.map(String::from).to_vec();
    argv.extend(["-f".into(), "-o".into(), report.display().to_string()]);
    argv.extend(user);
    let (code, text) = leased(p, &profile, with_bench(argv, &profile.inv), &profile.work).await?;
    if text.contains(NOTHING_PROFILED) {
        return nothing_profiled(p, &profile).await;
    }
    let body = truncate_output(&text, Default::default());
    let verdict = if code == Some(0) {
        "ok"
    } else {
        "ncu exited with an error"
    };
    let text = format!(
        "ncu {verdict}; report {}.ncu-rep (timings under ncu are several times too high: never compare them with bench speedups)\n{body}",
        report.display()
    );
    Ok(ToolOutput {
        is_error: code != Some(0),
        ..ToolOutput::ok(text)
    })
}

/// The answer to an ncu run that profiled nothing: the kernels that did run, from a listing.
async fn nothing_profiled<L: BenchLauncher>(
    p: &ProfileParams<'_, L>,
    profile: &Profile,
) -> Result<ToolOutput, ToolError> {
    let mut list = NCU.map(String::from).to_vec();
    list.extend(["-c", "40", "--metrics", "gpu__time_duration.sum"].map(String::from));
    let list = with_bench(list, &profile.inv);
    let (_, listing) = leased(p, profile, list, &profile.work.join("kernels")).await?;
    let names = kernel_names(&listing);
    Ok(ToolOutput::error(format!(
        "ncu profiled no kernel: your filter matched nothing (ncu's -k matches the short kernel name). \
         Kernels that ran in this bench: {}",
        if names.is_empty() {
            "(none seen)".to_string()
        } else {
            names.join(", ")
        }
    )))
}

/// `profile_nsys {args}`: Nsight Systems around the bench, when installed.
pub async fn nsys<L: BenchLauncher>(
    p: &ProfileParams<'_, L>,
    args: Option<String>,
) -> Result<ToolOutput, ToolError> {
    let profile = p.prepare(LeaseClass::Nsys);
    let mut argv: Vec<String> = ["nsys", "profile", "--stats=true", "-f", "true", "-o"]
        .map(String::from)
        .to_vec();
    argv.push(profile.work.join("report").display().to_string());
    argv.extend(
        args.unwrap_or_default()
            .split_whitespace()
            .map(str::to_string),
    );
    match leased(p, &profile, with_bench(argv, &profile.inv), &profile.work).await {
        Ok((code, text)) => Ok(ToolOutput {
            is_error: code != Some(0),
            ..ToolOutput::ok(truncate_output(&text, Default::default()))
        }),
        Err(ToolError::Infra { why, .. }) if why.contains("nsys") => Ok(ToolOutput::error(
            format!("profile_nsys is not available on this host: {why}"),
        )),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_names_are_the_short_names_ncu_matches() {
        let out = "==PROF== Connected to process 1\n  \
            void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::[lambda() (instance 1)]::operator ()() const::[lambda(float) (instance 1)], std::array<char *, 2>>(int, T2, T3) (128, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n    \
            Section: Command line profiler metrics\n  \
            void at::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void at::native::templates::cuda::normal_and_transform<float, float>(at::TensorIteratorBase &)>(long, T3) (528, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n  \
            void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float, 1>, unsigned int, float, 4, 4>>(T3) (64, 1, 1)x(16, 32, 1), Context 1, Stream 7, Device 0, CC 9.0\n  \
            _fk_l1_l2_norm_rows (64, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n  \
            void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3) (8, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n";
        assert_eq!(
            super::kernel_names(out),
            vec![
                "vectorized_elementwise_kernel",
                "distribution_elementwise_grid_stride_kernel",
                "reduce_kernel",
                "_fk_l1_l2_norm_rows",
            ]
        );
    }
}
