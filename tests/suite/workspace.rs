//! Workspace: layout, the path jail, and shell execution (timeout, truncation, environment).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fk_agentd::target::TargetId;
use fk_agentd::workspace::exec::{self, ShellEnd};
use fk_agentd::workspace::{
    Access, JailError, OutputLimits, ShellEnv, ShellRequest, Workspace, WorkspaceParams,
    truncate_output,
};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::gelu_workspace;

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn layout_has_scratch_candidate_slot_and_a_read_only_baseline_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let session = ws.session_dir().to_path_buf();
    assert_eq!(names_in(&session), vec!["cache", "candidate", "workspace"]);
    assert_eq!(
        names_in(ws.scratch_dir()),
        vec!["baseline", "candidate", "tmp"]
    );
    assert_eq!(
        names_in(&ws.scratch_dir().join("baseline/L1")),
        vec!["gelu.py", "gelu_kernel.cu"]
    );
    assert_eq!(ws.candidate_file(), session.join("candidate/L1/gelu.py"));
    assert_eq!(ws.candidate_rel(), "candidate/L1/gelu.py");
    // Reopening (resume) keeps what the agent wrote.
    fs::write(ws.candidate_file(), "x = 1\n").unwrap();
    let again = gelu_workspace(tmp.path());
    assert_eq!(
        fs::read_to_string(again.candidate_file()).unwrap(),
        "x = 1\n"
    );
}

#[test]
fn jail_accepts_scratch_files_and_the_candidate_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let scratch = ws.scratch_dir().to_path_buf();
    let cases: Vec<(&str, Access, PathBuf)> = vec![
        ("notes.md", Access::Write, scratch.join("notes.md")),
        (
            "./sub/dir/t.py",
            Access::Write,
            scratch.join("sub/dir/t.py"),
        ),
        ("candidate/L1/gelu.py", Access::Write, ws.candidate_file()),
        (
            "candidate/L1/gelu_fast.cu",
            Access::Write,
            ws.candidate_root().join("L1/gelu_fast.cu"),
        ),
        (
            "baseline/L1/gelu.py",
            Access::Read,
            scratch.join("baseline/L1/gelu.py"),
        ),
    ];
    for (rel, access, want) in cases {
        assert_eq!(ws.resolve(rel, access), Ok(want), "{rel}");
    }
}

#[test]
fn jail_refuses_parent_dirs_absolute_paths_and_writes_outside_the_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let not_slot = |p: &str| JailError::NotTheSlot {
        path: p.into(),
        slot: "candidate/L1/gelu.py".into(),
        exts: "cu, .cuh, .cpp, .cc, .h, .hpp".into(),
    };
    let cases: Vec<(&str, Access, JailError)> = vec![
        ("", Access::Read, JailError::Empty),
        ("../x", Access::Read, JailError::ParentDir("../x".into())),
        (
            "sub/../../x",
            Access::Read,
            JailError::ParentDir("sub/../../x".into()),
        ),
        (
            "/etc/passwd",
            Access::Read,
            JailError::Absolute("/etc/passwd".into()),
        ),
        (
            "baseline/L1/gelu.py",
            Access::Write,
            JailError::ReadOnly("baseline/L1/gelu.py".into()),
        ),
        (".", Access::Write, JailError::ReadOnly(".".into())),
        (
            "candidate/L1/silu.py",
            Access::Write,
            not_slot("candidate/L1/silu.py"),
        ),
        (
            "candidate/L2/gelu.py",
            Access::Write,
            not_slot("candidate/L2/gelu.py"),
        ),
        (
            "candidate/gelu.py",
            Access::Write,
            not_slot("candidate/gelu.py"),
        ),
    ];
    for (rel, access, want) in cases {
        assert_eq!(ws.resolve(rel, access), Err(want), "{rel}");
    }
}

#[test]
fn jail_refuses_symlinks_that_escape_or_dangle() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret.txt"), "s").unwrap();
    let link = |name: &str, to: &Path| {
        std::os::unix::fs::symlink(to, ws.scratch_dir().join(name)).unwrap()
    };
    link("out_dir", &outside);
    link("out_file", &outside.join("secret.txt"));
    link("dangling", &tmp.path().join("not-yet"));
    link("inside", Path::new("sub"));
    fs::create_dir_all(ws.scratch_dir().join("sub")).unwrap();

    let esc = |p: &str| Err(JailError::Escapes(p.into()));
    assert_eq!(
        ws.resolve("out_dir/secret.txt", Access::Read),
        esc("out_dir/secret.txt")
    );
    assert_eq!(
        ws.resolve("out_dir/new.txt", Access::Write),
        esc("out_dir/new.txt")
    );
    assert_eq!(ws.resolve("out_file", Access::Write), esc("out_file"));
    assert_eq!(
        ws.resolve("dangling", Access::Write),
        Err(JailError::DanglingLink("dangling".into()))
    );
    assert_eq!(
        ws.resolve("inside/a.txt", Access::Write),
        Ok(ws.scratch_dir().join("sub/a.txt"))
    );
}

fn env_with_secret() -> ShellEnv {
    ShellEnv::from_parent(
        [
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            (
                "FK_PROVIDER_TOKEN".to_string(),
                "sk-very-secret".to_string(),
            ),
        ],
        [("FK_AGENTD_SOCKET".to_string(), "/run/fk.sock".to_string())],
    )
}

fn request(cmd: &str, timeout: Duration) -> ShellRequest {
    ShellRequest {
        cmd: cmd.into(),
        timeout,
        limits: OutputLimits::default(),
    }
}

#[tokio::test]
async fn shell_sees_only_the_allowlisted_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    // cargo sets this in the test process; the child must not inherit it.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let out = exec::run(
        &ws,
        &env_with_secret(),
        &request("env | cut -d= -f1 | sort", Duration::from_secs(30)),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(out.end, ShellEnd::Exited(0));
    let names: Vec<&str> = out
        .output
        .lines()
        .filter(|n| !["PWD", "SHLVL", "_", "OLDPWD"].contains(n))
        .collect();
    assert_eq!(
        names,
        vec![
            "FASTKERNELS_CANDIDATE_DIR",
            "FASTKERNELS_RESULTS_DIR",
            "FK_AGENTD_SOCKET",
            "HOME",
            "LANG",
            "PATH",
            "TMPDIR",
            "TORCH_EXTENSIONS_DIR",
            "TRITON_CACHE_DIR",
        ]
    );
    let home = exec::run(
        &ws,
        &env_with_secret(),
        &request("echo $HOME; pwd; echo err >&2", Duration::from_secs(30)),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let scratch = ws.scratch_dir().display().to_string();
    assert_eq!(home.output, format!("{scratch}\n{scratch}\nerr\n"));
}

#[tokio::test]
async fn shell_timeout_kills_the_whole_process_group() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let cmd =
        "echo started; (sleep 60; echo leaked > leaked.txt) & echo $! > grandchild.pid; sleep 60";
    let out = exec::run(
        &ws,
        &env_with_secret(),
        &request(cmd, Duration::from_secs(1)),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (out.end, out.output.as_str()),
        (ShellEnd::TimedOut, "started\n")
    );
    let pid = fs::read_to_string(ws.scratch_dir().join("grandchild.pid")).unwrap();
    assert!(process_is_gone(pid.trim()), "grandchild {pid} survived");
}

/// True once `/proc/<pid>` is gone or a zombie; SIGKILL lands asynchronously, so look a few
/// times before concluding.
fn process_is_gone(pid: &str) -> bool {
    for _ in 0..100 {
        match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                if state.starts_with('Z') || state.starts_with('X') {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn shell_output_keeps_head_and_tail_with_a_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let out = exec::run(
        &ws,
        &env_with_secret(),
        &ShellRequest {
            cmd: "seq 1 1000; exit 3".into(),
            timeout: Duration::from_secs(30),
            limits: OutputLimits {
                max_bytes: 10 * 1024,
                max_lines: 6,
            },
        },
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(out.end, ShellEnd::Exited(3));
    assert_eq!(
        out.output,
        "[output: 1000 lines, 3893 bytes; showing the head and tail]\n1\n2\n3\n\
         [... 994 lines (3874 bytes) omitted ...]\n998\n999\n1000\n"
    );
}

#[test]
fn truncation_by_bytes_cuts_long_lines_and_leaves_short_output_alone() {
    let limits = OutputLimits {
        max_bytes: 20,
        max_lines: 256,
    };
    assert_eq!(truncate_output("short\n", limits), "short\n");
    let long = format!("{}\n", "x".repeat(100));
    assert_eq!(
        truncate_output(&long, limits),
        "[output: 1 lines, 101 bytes; showing the head and tail]\nxxxxxxxxxx\n\
         [... 0 lines (81 bytes) omitted ...]\nxxxxxxxxx\n"
    );
}

#[tokio::test]
async fn cancelling_a_command_kills_it_and_reports_cancellation() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = exec::run(
        &ws,
        &env_with_secret(),
        &request("sleep 60", Duration::from_secs(600)),
        &cancel,
    )
    .await
    .unwrap_err();
    assert_eq!(err.to_string(), "the command was cancelled");
}

#[test]
fn candidate_paths_reach_the_slot_even_if_the_link_was_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    let link = ws.scratch_dir().join("candidate");
    fs::remove_file(&link).unwrap();
    fs::create_dir_all(link.join("L1")).unwrap();
    assert_eq!(
        ws.resolve("candidate/L1/gelu.py", Access::Write),
        Ok(ws.candidate_file())
    );
}

#[test]
fn session_dirs_follow_the_run_layout_and_a_bad_baseline_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let target: TargetId = "L2/rms_norm".parse().unwrap();
    assert_eq!(
        fk_agentd::workspace::session_dir_for(Path::new("/runs/r1"), &target),
        PathBuf::from("/runs/r1/sessions/L2/rms_norm")
    );
    let missing = tmp.path().join("nope.py");
    let err = Workspace::create(&WorkspaceParams {
        session_dir: tmp.path().join("s"),
        target,
        baseline: missing.clone(),
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "baseline `{}` is not a readable .py file",
            missing.display()
        )
    );
}

/// A session folder removed while the session runs is told apart from an agent that wrote
/// nothing: the baseline copy set up with the folder is gone too.
#[test]
fn a_removed_session_folder_is_told_as_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = gelu_workspace(tmp.path());
    assert!(!ws.lost());
    // No candidate yet is not a lost folder.
    assert!(!ws.candidate_file().exists());
    assert!(!ws.lost());
    let run = tmp.path().join("run");
    make_writable(&run);
    fs::remove_dir_all(&run).unwrap();
    assert!(ws.lost());
}

/// Gives the owner write access to everything under `dir` (the baseline copy is read-only).
fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in walk(dir) {
        let mode = fs::metadata(&entry).unwrap().permissions().mode();
        fs::set_permissions(&entry, fs::Permissions::from_mode(mode | 0o700)).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if dir.is_dir() {
        for e in fs::read_dir(dir).unwrap() {
            out.extend(walk(&e.unwrap().path()));
        }
    }
    out
}
