//! The provider's token file is out of reach of agent code (Landlock): in the agent's shell, in
//! a leased job started by the broker, and in a child started straight into a cgroup. Each
//! test first shows the same command reading the token without the confinement, so it can fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fk_agentd::confine::{Confinement, Status};
use fk_agentd::gpu::LeaseClass;
use fk_agentd::gpu::{LaunchSpec, LeaseBackend, LeaseOutput, LocalBackend};
use fk_agentd::workspace::exec::{self, ShellEnd};
use fk_agentd::workspace::{OutputLimits, ShellEnv, ShellRequest};
use tokio_util::sync::CancellationToken;

use super::support::gelu_workspace;
use super::support::{params, req, rig_with, sh};

const TOKEN: &str = "fk-test-token-3f9a1c77e2";

/// A folder for a test's secrets: not under the system's /tmp, whose sticky shared folder
/// cannot hold a hidden file (see the last test).
fn private_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A token file with a neighbour in its folder.
fn secret(tmp: &Path) -> (PathBuf, PathBuf) {
    let dir = tmp.join("secrets");
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("cortex-token");
    std::fs::write(&token, TOKEN).unwrap();
    let neighbour = dir.join("readme.txt");
    std::fs::write(&neighbour, "a neighbour stays readable").unwrap();
    (token, neighbour)
}

/// The confinement hiding `token`, or `None` (the reason printed) where the kernel has no
/// Landlock; `FK_AGENTD_REQUIRE_LANDLOCK=1` makes that a failure.
fn hiding(token: &Path) -> Option<Confinement> {
    let c = Confinement::hiding(&[token.to_path_buf()], &[]);
    match c.status() {
        Status::Enforced => Some(c),
        other => {
            assert!(
                std::env::var_os("FK_AGENTD_REQUIRE_LANDLOCK").is_none(),
                "Landlock required but: {other:?}"
            );
            eprintln!("skipped: {}", c.describe());
            None
        }
    }
}

/// `cmd` in the agent's shell of `ws` under `env`, ended after `timeout`.
async fn shell(
    ws: &fk_agentd::workspace::Workspace,
    env: ShellEnv,
    cmd: &str,
    timeout: Duration,
) -> exec::ShellOutcome {
    exec::run(
        ws,
        &env,
        &ShellRequest {
            cmd: cmd.to_string(),
            timeout,
            limits: OutputLimits::default(),
        },
        &CancellationToken::new(),
    )
    .await
    .unwrap()
}

fn base64(s: &str) -> String {
    let out = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn assert_no_token(text: &str) {
    assert!(!text.contains(TOKEN), "the token leaked: {text}");
    assert!(
        !text.contains(&base64(TOKEN)),
        "the encoded token leaked: {text}"
    );
}

#[tokio::test]
async fn the_agent_shell_cannot_read_the_token_file_but_everything_else() {
    let tmp = private_dir();
    let (token, neighbour) = secret(tmp.path());
    // The home exists before a campaign's ruleset is built (entries made later beside a hidden
    // path are out of reach).
    let ws = gelu_workspace(tmp.path());
    let Some(confinement) = hiding(&token) else {
        return;
    };
    let cmd = format!(
        "cat {t}; base64 -w0 {t}; echo; ls {d}; cat {n}; echo; \
         head -c1 /proc/$PPID/mem; \
         echo written > $TMPDIR/w && cat $TMPDIR/w; ls /usr/bin/env",
        t = token.display(),
        d = token.parent().unwrap().display(),
        n = neighbour.display()
    );
    let run = |env: ShellEnv| shell(&ws, env, &cmd, Duration::from_secs(30));
    // As the daemon does at start (this test process stands in for it as the shell's parent).
    fk_agentd::confine::protect_self();
    let path = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let open = run(ShellEnv::from_parent(path.clone(), [])).await;
    assert!(open.output.contains(TOKEN), "{}", open.output);
    // Unconfined, the parent's memory opens (offset 0 is simply unmapped).
    assert!(
        open.output.contains("mem': Input/output error"),
        "{}",
        open.output
    );

    let shut = run(ShellEnv::from_parent(path, []).confined(confinement)).await;
    assert_eq!(shut.end, ShellEnd::Exited(0), "{}", shut.output);
    assert_no_token(&shut.output);
    let denied = shut.output.matches("Permission denied").count();
    // The file (cat, base64), its folder (ls) and the daemon's memory.
    assert!(denied >= 4, "{}", shut.output);
    assert!(
        shut.output.contains("a neighbour stays readable"),
        "{}",
        shut.output
    );
    assert!(
        shut.output.contains("written\n/usr/bin/env"),
        "{}",
        shut.output
    );
}

#[tokio::test]
async fn a_leased_job_cannot_read_the_token_file() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let Some(confinement) = hiding(&token) else {
        return;
    };
    let script = format!("cat {}", token.display());
    for (name, confined) in [("open", None), ("shut", Some(confinement))] {
        let mut p = params();
        if let Some(c) = confined.clone() {
            p.confinement = c;
        }
        let rig = rig_with(1, p);
        let dir = rig.dir.path().to_path_buf();
        let outcome = rig
            .broker
            .run(
                req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
                sh(&dir, name, &script),
                &CancellationToken::new(),
            )
            .await
            .expect("lease");
        let out = std::fs::read_to_string(&outcome.stdout).unwrap();
        let err = std::fs::read_to_string(&outcome.stderr).unwrap();
        match confined {
            None => assert_eq!((outcome.exit_code, out.as_str()), (Some(0), TOKEN)),
            Some(_) => {
                assert_no_token(&out);
                assert!(err.contains("Permission denied"), "{err}");
                assert_ne!(outcome.exit_code, Some(0));
            }
        }
    }
}

/// A cgroup lease's child enters its cgroup and the ruleset between fork and exec: the
/// command runs in the cgroup and cannot read the token.
#[tokio::test]
async fn a_cgroup_lease_child_enters_its_cgroup_and_the_ruleset_before_exec() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let Some(confinement) = hiding(&token) else {
        return;
    };
    let scope = fk_agentd::gpu::cgroup::scope_for(&tmp.path().join("fk-agentd.db"));
    let backend = LocalBackend::detect(Some(Path::new("/sys/fs/cgroup")), &scope);
    let Some(dir) = backend.cgroup_for("lease-confined", &[]) else {
        eprintln!("skipped: no writable cgroup hierarchy");
        return;
    };
    let argv = [
        "sh".to_string(),
        "-c".to_string(),
        format!("cat /proc/self/cgroup; cat {}", token.display()),
    ];
    let (out, err) = (tmp.path().join("o"), tmp.path().join("e"));
    let output = LeaseOutput::open(&out, &err).unwrap();
    let spec = LaunchSpec {
        lease_id: "lease-confined",
        argv: &argv,
        cwd: tmp.path(),
        env_remove: &[],
        env: vec![],
        output: &output,
        cgroup: Some(&dir),
        confine: confinement.entry(),
    };
    let launched = backend.launch(spec).expect("launch");
    assert!(
        launched.containment.is_cgroup(),
        "{:?}",
        launched.containment
    );
    let job = launched.job.clone();
    let ended = launched.exit.await.unwrap();
    assert_ne!(ended.code, Some(0));
    let printed = std::fs::read_to_string(&out).unwrap();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(printed.contains(&name), "not in {name}: {printed}");
    assert_no_token(&printed);
    assert!(
        std::fs::read_to_string(&err)
            .unwrap()
            .contains("Permission denied")
    );
    backend.release(&job).unwrap();
}

#[test]
fn a_missing_token_file_or_none_confines_nothing_and_says_so() {
    let c = Confinement::hiding(&[PathBuf::from("/nonexistent/fk-token")], &[]);
    assert!(matches!(c.status(), Status::Off(_)), "{c:?}");
    assert!(c.entry().is_none());
    assert_eq!(
        c.describe(),
        "agent code is not confined: no secret file to hide"
    );
}

#[test]
fn a_token_in_a_shared_temporary_folder_is_not_hidden_and_the_reason_says_where_to_put_it() {
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    let (token, _) = secret(tmp.path());
    let c = Confinement::hiding(&[token], &[]);
    assert!(matches!(c.status(), Status::Misplaced(_)), "{c:?}");
    // A start refuses it with exit 2 and the fix, unless the user opts out.
    let err = c.require(false).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("allow_unconfined"), "{err}");
    c.require(true).unwrap();
    assert!(c.entry().is_none());
    assert!(
        c.describe().contains("under /tmp") && c.describe().contains("~/.config/fk-agentd/token"),
        "{}",
        c.describe()
    );
}

/// `fk-agentd confined-exec`, which a Slurm step runs through on its node, enters the same
/// ruleset before it becomes the command: the token cannot be read, its neighbour can; a
/// command that cannot be run exits 127.
#[test]
fn confined_exec_hides_the_token_from_the_command_it_runs() {
    let tmp = private_dir();
    let (token, neighbour) = secret(tmp.path());
    if hiding(&token).is_none() {
        return;
    }
    let run = |hide: bool, argv: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
        cmd.arg("confined-exec");
        if hide {
            cmd.arg("--hide").arg(&token);
        }
        cmd.arg("--").args(argv).output().expect("confined-exec")
    };
    let script = format!(
        "cat {}; base64 -w0 {}; cat {}",
        token.display(),
        token.display(),
        neighbour.display()
    );
    let open = run(false, &["sh", "-c", &script]);
    assert!(
        String::from_utf8_lossy(&open.stdout).contains(TOKEN),
        "{open:?}"
    );
    let shut = run(true, &["sh", "-c", &script]);
    let out = String::from_utf8_lossy(&shut.stdout);
    assert!(
        !out.contains(TOKEN) && !out.contains(&base64(TOKEN)),
        "{out}"
    );
    assert!(out.contains("a neighbour stays readable"), "{out}");
    assert!(String::from_utf8_lossy(&shut.stderr).contains("Permission denied"));
    let missing = run(true, &["no-such-program-fk"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
}

/// `confined-exec --require` (every Slurm step unless `[security] allow_unconfined`) refuses
/// with exit 125, without running the command, where the paths cannot be hidden (here: a file
/// under /tmp); without `--require` it runs the command unconfined and says so.
#[test]
fn confined_exec_with_require_refuses_where_it_cannot_hide() {
    let tmp = tempfile::Builder::new()
        .prefix("fk-require")
        .tempdir_in("/tmp")
        .unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let marker = tmp.path().join("ran");
    let run = |require: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
        cmd.arg("confined-exec");
        if require {
            cmd.arg("--require");
        }
        cmd.arg("--hide").arg(&token).arg("--");
        cmd.args(["touch", marker.to_str().unwrap()]);
        cmd.output().expect("confined-exec")
    };
    let refused = run(true);
    assert_eq!(
        refused.status.code(),
        Some(fk_agentd::confine::CANNOT_CONFINE),
        "{refused:?}"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("cannot hide the secret files here"),
        "{refused:?}"
    );
    assert!(!marker.exists(), "the command ran");
    let unconfined = run(false);
    assert!(unconfined.status.success(), "{unconfined:?}");
    assert!(String::from_utf8_lossy(&unconfined.stderr).contains("running unconfined"));
    assert!(marker.exists());
}

/// The import check runs candidate code (the module's top level) before every validate: it
/// enters the same ruleset, so a candidate that reads the token file on import and raises with
/// it gets "Permission denied", and it sees only its allowlisted environment (no token
/// variable of the daemon).
#[tokio::test]
async fn the_import_check_runs_candidate_code_confined_and_without_the_daemons_environment() {
    use fk_agentd::harness::import_check::{ImportCheck, ImportVerdict};
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    // Made before the ruleset (entries created later beside the hidden folder stay closed).
    let harness = tmp.path().join("harness");
    let base = harness.join("fastkernels/tasks/baseline/L1");
    std::fs::create_dir_all(&base).unwrap();
    for pkg in [
        "fastkernels",
        "fastkernels/tasks",
        "fastkernels/tasks/baseline",
    ] {
        std::fs::write(harness.join(pkg).join("__init__.py"), "").unwrap();
    }
    std::fs::write(base.join("__init__.py"), "").unwrap();
    std::fs::write(base.join("gelu.py"), "class GELU:\n    pass\n").unwrap();
    let candidate = tmp.path().join("gelu.py");
    std::fs::write(
        &candidate,
        format!(
            "import os\nleak = [os.environ.get('FK_TEST_PROVIDER_TOKEN', '')]\ntry:\n    leak.append(open({:?}).read())\nexcept OSError as e:\n    leak.append(str(e))\nraise RuntimeError(repr(leak))\n",
            token.display().to_string()
        ),
    )
    .unwrap();
    let Some(confinement) = hiding(&token) else {
        return;
    };
    let check = ImportCheck {
        python: vec!["python3".into()],
        harness,
        timeout: Duration::from_secs(60),
        env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
        confinement,
    };
    // SAFETY of the test: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("FK_TEST_PROVIDER_TOKEN", TOKEN) };
    let verdict = check
        .run(&"L1/gelu".parse().unwrap(), &candidate, &["GELU".into()])
        .await;
    let ImportVerdict::Candidate(text) = verdict else {
        panic!("{verdict:?}");
    };
    assert!(text.contains("Permission denied"), "{text}");
    assert_no_token(&text);
}

/// A simulated campaign with a token file keeps it from its agents as a real one does: every
/// scripted agent's first command tries to read it (cat, base64, base32, od, rev, gzip, Python,
/// a lease, the daemon's environment), and its first candidate when imported (refused in the
/// import check, before any bench), and the server sees those reads refused, never one that
/// got through; a token under the shared temporary folder is refused before any session.
#[test]
fn the_simulations_agents_that_try_to_read_the_token_file_are_refused() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    if hiding(&token).is_none() {
        return;
    }
    let home = tmp.path().join("home");
    let out = super::support::fk(&home)
        .env(fk_agentd::sim::faults::SIM_TOKEN_FILE_ENV, &token)
        .args(["start", "--sim", "--targets", "L1/gelu,L1/relu"])
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.join("sim-faults.json")).unwrap()).unwrap();
    let n = |k: &str| report[k].as_u64().unwrap();
    assert!(n("reads_refused") > 0, "{report}");
    assert!(n("candidate_reads_refused") > 0, "{report}");
    assert_eq!(
        (n("reads_redacted"), n("tokens_in_bodies")),
        (0, 0),
        "{report}"
    );
    // The candidates' reads at import were refused in the import check, before any bench.
    let refused_at_import = super::support::probes::walk(&home)
        .iter()
        .filter(|p| p.ends_with("transcript.jsonl"))
        .any(|p| {
            let t = std::fs::read_to_string(p).unwrap_or_default();
            t.contains("validation not run") && t.contains(fk_agentd::sim::bench::CANDIDATE_READ)
        });
    assert!(refused_at_import);
    for path in super::support::probes::walk(&home) {
        assert_no_token(&String::from_utf8_lossy(&std::fs::read(&path).unwrap()));
    }

    let shared = tempfile::tempdir_in("/tmp").unwrap();
    let exposed = shared.path().join("token");
    std::fs::write(&exposed, TOKEN).unwrap();
    let refused = super::support::fk(&tmp.path().join("home2"))
        .env(fk_agentd::sim::faults::SIM_TOKEN_FILE_ENV, &exposed)
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("refusing to start"), "{err}");
}

/// The fallback where the kernel has no Landlock (forced here), or `None` (the reason printed)
/// where the host allows no user namespaces.
fn namespaced(token: &Path) -> Option<Confinement> {
    let token = token.canonicalize().unwrap();
    let c = Confinement::namespaced(&[token], &[], "Landlock left out for the test");
    match c.status() {
        Status::Namespaced => Some(c),
        other => {
            eprintln!("skipped: {other:?}");
            None
        }
    }
}

/// Without Landlock: the agent's shell in its own namespaces cannot read the token file, list
/// its folder, reach it through `/proc/<pid>/root` of a process of the same user outside (this
/// test's own), or unmount the cover; the rest of the file system, its exit code and its
/// output are as before.
#[tokio::test]
async fn without_landlock_the_shell_runs_in_namespaces_that_cover_the_token_folder() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let ws = gelu_workspace(tmp.path());
    let Some(confinement) = namespaced(&token) else {
        return;
    };
    assert!(
        confinement.describe().contains("namespaces"),
        "{}",
        confinement.describe()
    );
    let outside = std::process::id();
    let cmd = format!(
        "cat {t}; base64 -w0 {t}; echo; ls {d}; cat /proc/{outside}/root{t}; \
         cat /proc/1/root{t}; umount {d}; cat {t}; ls /proc | grep -cx '[0-9]*'; \
         echo written > $TMPDIR/w && cat $TMPDIR/w; ls /usr/bin/env; exit 3",
        t = token.display(),
        d = token.parent().unwrap().display(),
    );
    let path = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let run = |env: ShellEnv| shell(&ws, env, &cmd, Duration::from_secs(30));
    let open = run(ShellEnv::from_parent(path.clone(), [])).await;
    assert!(open.output.contains(TOKEN), "{}", open.output);
    let shut = run(ShellEnv::from_parent(path, []).confined(confinement)).await;
    assert_eq!(shut.end, ShellEnd::Exited(3), "{}", shut.output);
    assert_no_token(&shut.output);
    // Only the namespace's own processes are in its /proc: the shell and its few children.
    let procs: Vec<&str> = shut
        .output
        .lines()
        .filter(|l| l.parse::<u32>().is_ok())
        .collect();
    assert!(
        procs.iter().any(|n| n.parse::<u32>().unwrap() < 10),
        "{}",
        shut.output
    );
    assert!(
        shut.output.contains("written\n/usr/bin/env"),
        "{}",
        shut.output
    );
}

/// Without Landlock: a leased job cannot read the token either, and its exit code comes back.
#[tokio::test]
async fn without_landlock_a_leased_job_cannot_read_the_token_file() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let Some(confinement) = namespaced(&token) else {
        return;
    };
    let mut p = params();
    p.confinement = confinement;
    let rig = rig_with(1, p);
    let dir = rig.dir.path().to_path_buf();
    let script = format!("cat {}; exit 7", token.display());
    let outcome = rig
        .broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
            sh(&dir, "ns", &script),
            &CancellationToken::new(),
        )
        .await
        .expect("lease");
    let out = std::fs::read_to_string(&outcome.stdout).unwrap();
    let err = std::fs::read_to_string(&outcome.stderr).unwrap();
    assert_no_token(&out);
    assert!(err.contains("No such file"), "{err}");
    assert_eq!(outcome.exit_code, Some(7), "{outcome:?}");
}

/// Without Landlock, a token in `$HOME` itself cannot be hidden by covering its folder: the
/// reason says where to put it.
#[test]
fn without_landlock_a_token_beside_everything_else_is_refused_with_where_to_put_it() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let token = token.canonicalize().unwrap();
    let reachable = [token.parent().unwrap().join("runs")];
    let c = Confinement::namespaced(&[token], &reachable, "no Landlock");
    assert!(matches!(c.status(), Status::Unsupported(_)), "{c:?}");
    assert!(c.entry().is_none());
    let why = c.describe();
    assert!(
        why.contains("no Landlock") && why.contains("folder of its own"),
        "{why}"
    );
    assert_eq!(c.require(false).unwrap_err().exit_code(), 3);
}

/// Without Landlock: a command past its timeout is ended with every process of its namespace
/// (the shell there is the namespace's first process, which ignores a plain SIGTERM).
#[tokio::test]
async fn without_landlock_a_command_past_its_timeout_is_ended_with_its_children() {
    let tmp = private_dir();
    let (token, _) = secret(tmp.path());
    let ws = gelu_workspace(tmp.path());
    let Some(confinement) = namespaced(&token) else {
        return;
    };
    let marker = format!("fk-ns-timeout-{}", std::process::id());
    let env = ShellEnv::from_parent([("PATH".to_string(), "/usr/bin:/bin".to_string())], [])
        .confined(confinement);
    let started = std::time::Instant::now();
    let cmd = format!("sh -c 'sleep 60; : {marker}' & sleep 60; : {marker}");
    let out = shell(&ws, env, &cmd, Duration::from_secs(1)).await;
    assert!(matches!(out.end, ShellEnd::TimedOut), "{:?}", out.end);
    assert!(started.elapsed() < Duration::from_secs(20));
    let alive = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .count();
    assert_eq!(alive, 0, "processes of the command outlived it");
}
