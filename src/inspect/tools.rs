//! Each tool call in its own words: what the arguments and the recorded output of `shell`,
//! `write_file`, `apply_patch`, `validate`, `profile_ncu`/`profile_nsys` and `finish` mean,
//! parsed from the texts the tools write (`src/tools`, `src/agent/gpu_tools.rs`).
//!
//! Invariant: parsing is lenient — an output in an unexpected shape leaves fields empty and the
//! raw text is still shown; nothing here fails.

use serde::Serialize;

use crate::tools::{CallArgs, ToolName};

use super::outcome::screen_findings;

/// What a tool call did, by tool.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum ToolDetail {
    Shell(ShellDetail),
    ReadFile {
        path: String,
        offset: Option<u64>,
        limit: Option<u64>,
    },
    WriteFile {
        path: String,
        lines: usize,
        bytes: usize,
    },
    ApplyPatch {
        /// `add`/`update`/`delete`/`move` and the path.
        files: Vec<(String, String)>,
    },
    Validate(ValidateDetail),
    Profile(ProfileDetail),
    Finish {
        summary: String,
    },
    #[default]
    Other,
}

/// A shell call's command and what it did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShellDetail {
    pub cmd: String,
    /// `exit 0`, `exit 2`, `killed by signal 9`, `timed out after 120 s`.
    pub end: Option<String>,
    pub exit_code: Option<i32>,
    /// The wall time the shell measured.
    pub wall_s: Option<f64>,
    /// What the command printed (stdout and stderr, as the tool truncated it).
    pub output: Option<String>,
}

/// A validate call's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ValidateDetail {
    /// Scenario rows as the tool printed them.
    pub rows: Vec<String>,
    /// The tool's `verdict:` line, without the word.
    pub verdict: Option<String>,
    pub screen: Vec<String>,
    /// Lines that are neither rows nor the verdict (a refusal, a simulated banner).
    pub notes: Vec<String>,
}

/// A profile call's profiler, arguments and report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileDetail {
    pub profiler: String,
    pub args: Option<String>,
    pub report: Option<String>,
    /// The first line of the answer (`ncu ok; …`, or why nothing was profiled).
    pub summary: Option<String>,
}

/// Reads a call's arguments and (once finished) its output.
pub fn detail_of(name: &str, args: &CallArgs, output: Option<&str>) -> ToolDetail {
    let arg = |k: &str| args.text(k).unwrap_or("").to_string();
    let Some(tool) = ToolName::from_word(name) else {
        return ToolDetail::Other;
    };
    match tool {
        ToolName::Shell => shell(arg("cmd"), output),
        ToolName::ReadFile => ToolDetail::ReadFile {
            path: arg("path"),
            offset: args.fields.offset,
            limit: args.fields.limit,
        },
        ToolName::WriteFile => {
            let content = arg("content");
            ToolDetail::WriteFile {
                path: arg("path"),
                lines: content.lines().count(),
                bytes: content.len(),
            }
        }
        ToolName::ApplyPatch => ToolDetail::ApplyPatch {
            files: patch_files(&arg("patch")),
        },
        ToolName::Validate => validate(output.unwrap_or("")),
        ToolName::ProfileNcu | ToolName::ProfileNsys => profile(name, args.text("args"), output),
        ToolName::Finish => ToolDetail::Finish {
            summary: arg("summary"),
        },
    }
}

fn shell(cmd: String, output: Option<&str>) -> ToolDetail {
    let bare = |cmd, output| {
        ToolDetail::Shell(ShellDetail {
            cmd,
            end: None,
            exit_code: None,
            wall_s: None,
            output,
        })
    };
    let Some(out) = output else {
        return bare(cmd, None);
    };
    let mut lines = out.splitn(3, '\n');
    let head = lines.next().unwrap_or("");
    let wall = lines.next().unwrap_or("");
    let rest = lines.next().unwrap_or("");
    let wall_s = wall
        .strip_prefix("Wall time: ")
        .and_then(|w| w.trim_end_matches(" s").parse().ok());
    let Some(body) = rest
        .strip_prefix("Output:\n")
        .or(rest.strip_prefix("Output:"))
    else {
        // Not the shell's own format (a refusal): show it as output.
        return bare(cmd, Some(out.to_string()));
    };
    let exit_code = head
        .strip_prefix("Exit code: ")
        .and_then(|c| c.trim().parse().ok());
    let end = match exit_code {
        Some(c) => format!("exit {c}"),
        None => head
            .replace("Killed by signal", "killed by signal")
            .replace("Timed out after", "timed out after"),
    };
    ToolDetail::Shell(ShellDetail {
        cmd,
        end: Some(end),
        exit_code,
        wall_s,
        output: Some(body.to_string()),
    })
}

fn patch_files(patch: &str) -> Vec<(String, String)> {
    let ops = [
        ("*** Add File: ", "add"),
        ("*** Update File: ", "update"),
        ("*** Delete File: ", "delete"),
        ("*** Move to: ", "move to"),
    ];
    patch
        .lines()
        .filter_map(|l| {
            ops.iter().find_map(|(prefix, op)| {
                l.strip_prefix(prefix)
                    .map(|p| (op.to_string(), p.trim().to_string()))
            })
        })
        .collect()
}

fn validate(out: &str) -> ToolDetail {
    let body = out
        .split_once("\n\n\nreward-hack screen findings")
        .map_or(out, |(b, _)| b);
    let (mut rows, mut notes, mut verdict) = (Vec::new(), Vec::new(), None);
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(v) = line.strip_prefix("verdict: ") {
            verdict = Some(v.to_string());
        } else if is_row(line) {
            rows.push(line.trim_end().to_string());
        } else {
            notes.push(line.to_string());
        }
    }
    ToolDetail::Validate(ValidateDetail {
        rows,
        verdict,
        screen: screen_findings(out),
        notes,
    })
}

/// A scenario row starts with a status word (`PASSED`, `INCORRECT_NUMERICAL`, …).
fn is_row(line: &str) -> bool {
    let word = line.split_whitespace().next().unwrap_or("");
    word.len() >= 4 && word.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

fn profile(name: &str, args: Option<&str>, output: Option<&str>) -> ToolDetail {
    let out = output.unwrap_or("");
    let report = out
        .split_whitespace()
        .find(|w| w.ends_with(".ncu-rep") || w.ends_with(".nsys-rep"))
        .map(|w| w.trim_matches(['(', ')', ',']).to_string());
    ToolDetail::Profile(ProfileDetail {
        profiler: name.trim_start_matches("profile_").to_string(),
        args: args.map(str::to_string),
        report,
        summary: output.and_then(|o| o.lines().next()).map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: serde_json::Value) -> CallArgs {
        CallArgs::parse(&v.to_string())
    }

    #[test]
    fn a_shell_output_gives_its_end_wall_time_and_text() {
        let d = detail_of(
            "shell",
            &args(json!({"cmd": "ls"})),
            Some("Exit code: 2\nWall time: 1.5 s\nOutput:\na\nb\n"),
        );
        assert_eq!(
            d,
            ToolDetail::Shell(ShellDetail {
                cmd: "ls".into(),
                end: Some("exit 2".into()),
                exit_code: Some(2),
                wall_s: Some(1.5),
                output: Some("a\nb\n".into()),
            })
        );
    }

    #[test]
    fn a_patch_names_the_files_it_touches() {
        let d = detail_of(
            "apply_patch",
            &args(
                json!({"patch": "*** Begin Patch\n*** Update File: candidate/L1/gelu.py\n@@\n-a\n+b\n*** Add File: notes.txt\n+x\n*** End Patch"}),
            ),
            None,
        );
        assert_eq!(
            d,
            ToolDetail::ApplyPatch {
                files: vec![
                    ("update".into(), "candidate/L1/gelu.py".into()),
                    ("add".into(), "notes.txt".into())
                ]
            }
        );
    }

    #[test]
    fn an_ncu_answer_gives_its_report_path() {
        let d = detail_of(
            "profile_ncu",
            &args(json!({"args": "-c 1"})),
            Some("ncu ok; report /w/profiles/001-ncu/report.ncu-rep (timings under ncu …)\nbody"),
        );
        let ToolDetail::Profile(ProfileDetail { report, .. }) = d else {
            panic!("not a profile: {d:?}")
        };
        assert_eq!(
            report.as_deref(),
            Some("/w/profiles/001-ncu/report.ncu-rep")
        );
    }
}
