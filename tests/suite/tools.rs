//! Tools: the spec list, dispatch, the file tools, apply_patch and the GPU seam.

use std::fs;
use std::sync::Arc;

use fk_agentd::tools::{
    NoGpuTools, ToolError, ToolLimits, ToolOutput, Toolbox, ToolboxParams, tool_specs,
};
use fk_agentd::workspace::ShellEnv;
use pretty_assertions::assert_eq;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::support::gelu_workspace;

fn toolbox(tmp: &std::path::Path) -> Toolbox {
    Toolbox::new(ToolboxParams {
        workspace: gelu_workspace(tmp),
        gpu: Arc::new(NoGpuTools),
        shell_env: ShellEnv::from_parent([], []),
        limits: ToolLimits::default(),
    })
}

async fn call(tb: &Toolbox, name: &str, args: &str) -> ToolOutput {
    tb.call(name, args, CancellationToken::new()).await.unwrap()
}

fn err(text: &str) -> ToolOutput {
    ToolOutput::error(text)
}

#[test]
fn tool_list_matches_the_contract() {
    let specs = tool_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        vec![
            "shell",
            "read_file",
            "write_file",
            "apply_patch",
            "validate",
            "profile_ncu",
            "profile_nsys",
            "finish"
        ]
    );
    for spec in &specs {
        let p = &spec.parameters;
        assert_eq!(p["type"], "object", "{}", spec.name);
        assert_eq!(p["additionalProperties"], false, "{}", spec.name);
        let props = p["properties"].as_object().unwrap();
        for req in p["required"].as_array().unwrap() {
            assert!(
                props.contains_key(req.as_str().unwrap()),
                "{}: {req}",
                spec.name
            );
        }
        for (name, schema) in props {
            let ty = schema["type"].as_str().unwrap_or("");
            assert!(["string", "integer"].contains(&ty), "{}.{name}", spec.name);
        }
    }
    let json = serde_json::to_string_pretty(&specs).unwrap();
    insta::assert_snapshot!("tool_specs", json);
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_are_errors_the_model_sees() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    assert_eq!(
        call(&tb, "read_file", "{not json").await,
        err("invalid arguments for `read_file`: key must be a string at line 1 column 2")
    );
    assert_eq!(
        call(&tb, "shell", r#"{"cmd":"ls","cwd":"/"}"#).await,
        err(
            "invalid arguments for `shell`: unknown field `cwd`, expected `cmd` or `timeout_s` at line 1 column 17"
        )
    );
    assert_eq!(
        call(&tb, "write_file", r#"{"path":"a"}"#).await,
        err("invalid arguments for `write_file`: missing field `content` at line 1 column 12")
    );
    assert_eq!(
        call(&tb, "web_search", "{}").await,
        err(
            "unknown tool `web_search`; the tools are: shell, read_file, write_file, apply_patch, validate, profile_ncu, profile_nsys, finish"
        )
    );
    assert_eq!(
        call(&tb, "shell", r#"{"cmd":"true","timeout_s":0}"#).await,
        err("timeout_s must be at least 1")
    );
}

#[tokio::test]
async fn shell_reports_exit_code_and_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    let out = call(&tb, "shell", r#"{"cmd":"echo hi; exit 2"}"#).await;
    assert!(out.is_error);
    assert!(
        out.text.starts_with("Exit code: 2\nWall time: "),
        "{}",
        out.text
    );
    assert!(out.text.ends_with("\nOutput:\nhi\n"), "{}", out.text);
}

#[tokio::test]
async fn write_then_read_with_offset_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    let content = (1..=10).map(|i| format!("line {i}\n")).collect::<String>();
    let args = serde_json::json!({"path": "candidate/L1/gelu.py", "content": content});
    assert_eq!(
        call(&tb, "write_file", &args.to_string()).await,
        ToolOutput::ok("Wrote 71 bytes to candidate/L1/gelu.py")
    );
    assert_eq!(
        fs::read_to_string(tb.workspace().candidate_file()).unwrap(),
        content
    );
    assert_eq!(
        call(
            &tb,
            "read_file",
            r#"{"path":"candidate/L1/gelu.py","offset":3,"limit":2}"#
        )
        .await,
        ToolOutput::ok(
            "[candidate/L1/gelu.py: lines 3-4 of 10]\nline 3\nline 4\n[6 more lines; continue with offset=5]"
        )
    );
    assert_eq!(
        call(
            &tb,
            "read_file",
            r#"{"path":"candidate/L1/gelu.py","offset":9}"#
        )
        .await,
        ToolOutput::ok("[candidate/L1/gelu.py: lines 9-10 of 10]\nline 9\nline 10\n")
    );
    assert_eq!(
        call(
            &tb,
            "read_file",
            r#"{"path":"candidate/L1/gelu.py","offset":11}"#
        )
        .await,
        err("offset 11 is past the end of `candidate/L1/gelu.py` (10 lines)")
    );
    assert_eq!(
        call(&tb, "read_file", r#"{"path":"missing.py"}"#).await,
        err("cannot read `missing.py`: No such file or directory (os error 2)")
    );
    assert_eq!(
        call(&tb, "write_file", r#"{"path":"../escape.py","content":""}"#).await,
        err("path `../escape.py` contains `..`; paths must stay inside the workspace")
    );
}

#[tokio::test]
async fn apply_patch_adds_updates_and_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    let scratch = tb.workspace().scratch_dir().to_path_buf();
    fs::write(scratch.join("old.txt"), "bye\n").unwrap();
    fs::write(
        tb.workspace().candidate_file(),
        "import torch\n\nclass GELU(torch.nn.Module):\n    def forward(self, x):\n        return x\n",
    )
    .unwrap();
    let patch = "*** Begin Patch\n\
                 *** Add File: notes/plan.md\n\
                 +# plan\n\
                 +fuse it\n\
                 *** Update File: candidate/L1/gelu.py\n\
                 @@ class GELU(torch.nn.Module):\n\
                 \x20    def forward(self, x):\n\
                 -        return x\n\
                 +        return my_gelu(x)\n\
                 *** Delete File: old.txt\n\
                 *** End Patch";
    let out = call(
        &tb,
        "apply_patch",
        &serde_json::json!({"patch": patch}).to_string(),
    )
    .await;
    assert_eq!(
        out,
        ToolOutput::ok("Patch applied:\nA notes/plan.md\nM candidate/L1/gelu.py\nD old.txt")
    );
    assert_eq!(
        fs::read_to_string(scratch.join("notes/plan.md")).unwrap(),
        "# plan\nfuse it\n"
    );
    assert_eq!(
        fs::read_to_string(tb.workspace().candidate_file()).unwrap(),
        "import torch\n\nclass GELU(torch.nn.Module):\n    def forward(self, x):\n        return my_gelu(x)\n"
    );
    assert!(!scratch.join("old.txt").exists());
}

#[tokio::test]
async fn apply_patch_with_a_stale_hunk_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    let scratch = tb.workspace().scratch_dir().to_path_buf();
    fs::write(scratch.join("a.py"), "x = 1\ny = 2\n").unwrap();
    let patch = "*** Begin Patch\n\
                 *** Add File: new.py\n\
                 +z = 3\n\
                 *** Update File: a.py\n\
                 @@\n\
                 -y = 3\n\
                 +y = 4\n\
                 *** End Patch";
    let out = call(
        &tb,
        "apply_patch",
        &serde_json::json!({"patch": patch}).to_string(),
    )
    .await;
    assert_eq!(
        out,
        err(
            "the patch was not applied (no file changed): hunk 1 of `a.py` did not match the file: these lines were not found:\ny = 3"
        )
    );
    assert!(!scratch.join("new.py").exists());
    assert_eq!(
        fs::read_to_string(scratch.join("a.py")).unwrap(),
        "x = 1\ny = 2\n"
    );

    let no_envelope = call(&tb, "apply_patch", r#"{"patch":"--- a/a.py\n+++ b/a.py"}"#).await;
    assert_eq!(
        no_envelope,
        err("the patch was not applied: patch line 1: the patch must start with `*** Begin Patch`")
    );
}

#[tokio::test]
async fn gpu_tools_without_a_broker_are_infrastructure_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    assert_eq!(
        call(&tb, "validate", "{}").await,
        err("there is no candidate to validate yet: write `candidate/L1/gelu.py` first")
    );
    fs::write(tb.workspace().candidate_file(), "class GELU: pass\n").unwrap();
    for (name, args) in [
        ("validate", "{}"),
        ("profile_ncu", r#"{"args":"--set full"}"#),
        ("profile_nsys", ""),
    ] {
        let e = tb
            .call(name, args, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::Infra { .. }), "{name}: {e:?}");
        assert!(!e.is_retryable());
        assert_eq!(
            e.to_string(),
            format!(
                "`{name}` is unavailable: no GPU broker is attached to this session (NoGpuTools)"
            )
        );
    }
}

#[tokio::test]
async fn finish_carries_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let tb = toolbox(tmp.path());
    assert_eq!(
        call(&tb, "finish", r#"{"summary":"  fused tanh gelu, 1.4x  "}"#).await,
        ToolOutput {
            text: "Session finished.".into(),
            is_error: false,
            finished: Some("fused tanh gelu, 1.4x".into()),
        }
    );
    assert_eq!(
        call(&tb, "finish", r#"{"summary":" "}"#).await,
        err("summary is empty: say what you built and how fast it is")
    );
}

#[test]
fn specs_serialize_as_responses_function_tools() {
    let specs: Value = serde_json::to_value(tool_specs()).unwrap();
    assert_eq!(specs[0]["type"], "function");
    assert_eq!(specs[0]["strict"], false);
}

/// A view reads a call's arguments leniently and shows them as the model wrote them.
#[test]
fn call_arguments_read_leniently_and_serialize_as_written() {
    use fk_agentd::tools::CallArgs;
    let json = CallArgs::parse(r#"{"path": "a.py", "offset": 3, "extra": [1]}"#);
    assert_eq!(
        (json.text("path"), json.fields.offset),
        (Some("a.py"), Some(3))
    );
    let as_json: Value = serde_json::to_value(&json).unwrap();
    assert_eq!(as_json["extra"][0], 1);
    let text = CallArgs::parse("cat a.py");
    assert_eq!(
        (text.text("cmd"), serde_json::to_value(&text).unwrap()),
        (None, Value::from("cat a.py"))
    );
    let wrong = CallArgs::parse(r#"{"offset": "three", "path": "a.py"}"#);
    assert_eq!(wrong.text("path"), None);
}
