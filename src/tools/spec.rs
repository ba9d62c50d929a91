//! The tool list the model sees: names, descriptions and JSON Schema parameters.
//!
//! Exactly the contract in DESIGN.md ("Agent tools"); every schema is an object with
//! `additionalProperties: false`, and the argument structs in `tools::args` deny unknown
//! fields, so the two cannot drift apart silently (a test checks both).

use serde::Serialize;
use serde_json::{Value, json};

use super::ToolName;

/// One function tool as sent in a Responses request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolSpec {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    pub parameters: Value,
    /// Strict mode would make every property required; ours has optional ones.
    pub strict: bool,
}

fn function(name: ToolName, description: &'static str, parameters: Value) -> ToolSpec {
    ToolSpec {
        kind: "function",
        name: name.as_str(),
        description,
        parameters,
        strict: false,
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The eight tools, in a fixed order: the workspace's, then the GPU's and `finish`.
pub fn tool_specs() -> Vec<ToolSpec> {
    let mut specs = workspace_tools();
    specs.extend(gpu_tools_and_finish());
    specs
}

/// The tools that work in the workspace: `shell`, `read_file`, `write_file`, `apply_patch`.
fn workspace_tools() -> Vec<ToolSpec> {
    vec![
        function(
            ToolName::Shell,
            "Run a bash command in your workspace directory (also $HOME) and return its exit \
             code and combined stdout/stderr. Long output keeps only its head and tail. The \
             command's whole process group is killed when it ends or times out. Use \
             `fk-agentd lease -- CMD` for a command of your own that needs a GPU.",
            object(
                json!({
                    "cmd": {"type": "string", "description": "The bash command line."},
                    "timeout_s": {"type": "integer", "minimum": 1,
                                  "description": "Seconds before the command is killed (default 600)."}
                }),
                &["cmd"],
            ),
        ),
        function(
            ToolName::ReadFile,
            "Read a text file. Paths are relative to the workspace; the baseline copy is under \
             baseline/, your candidate under candidate/.",
            object(
                json!({
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 1,
                               "description": "First line to return, 1-based (default 1)."},
                    "limit": {"type": "integer", "minimum": 1,
                              "description": "Most lines to return (default 400)."}
                }),
                &["path"],
            ),
        ),
        function(
            ToolName::WriteFile,
            "Create or replace a file with the given content, creating parent directories. \
             Writable: workspace files outside baseline/, your candidate file, and .cu/.cuh/\
             .cpp/.cc/.h/.hpp sources beside it.",
            object(
                json!({
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                }),
                &["path", "content"],
            ),
        ),
        function(
            ToolName::ApplyPatch,
            "Edit files with a patch: `*** Begin Patch`, then `*** Add File: p` (lines start \
             with +), `*** Delete File: p`, or `*** Update File: p` (optional `*** Move to: q`) \
             followed by hunks that start with `@@` (optionally `@@ <line to search from>`), \
             whose lines start with ' ' (context), '-' (remove) or '+' (add); then \
             `*** End Patch`. Give about 3 lines of context. All files change or none do.",
            object(
                json!({"patch": {"type": "string", "description": "The whole patch text."}}),
                &["patch"],
            ),
        ),
    ]
}

/// The tools that lease a GPU (`validate`, `profile_ncu`, `profile_nsys`), and `finish`.
fn gpu_tools_and_finish() -> Vec<ToolSpec> {
    vec![
        function(
            ToolName::Validate,
            "Benchmark your candidate file against the baseline on a leased GPU over the \
             captured shapes: correctness on every case, then timing. Returns the per-case \
             verdicts and speedups.",
            object(json!({}), &[]),
        ),
        function(
            ToolName::ProfileNcu,
            "Profile your candidate with Nsight Compute on a leased GPU and return the report \
             summary. Timings under ncu are inflated; use them to compare kernels, not as results.",
            object(
                json!({"args": {"type": "string",
                                "description": "Extra ncu arguments, e.g. `--section SpeedOfLight -k regex:my_kernel`."}}),
                &[],
            ),
        ),
        function(
            ToolName::ProfileNsys,
            "Trace your candidate with Nsight Systems on a leased GPU and return the kernel \
             and API summary.",
            object(
                json!({"args": {"type": "string", "description": "Extra nsys arguments."}}),
                &[],
            ),
        ),
        function(
            ToolName::Finish,
            "End the session. Call it once your candidate is as fast as you can make it (or \
             you are stopping); the summary says what you built, its validated speedup, and \
             anything left unresolved.",
            object(json!({"summary": {"type": "string"}}), &["summary"]),
        ),
    ]
}

#[cfg(test)]
mod named {
    use super::*;

    #[test]
    fn every_tool_name_has_one_spec() {
        let specs: Vec<&str> = tool_specs().iter().map(|s| s.name).collect();
        assert_eq!(specs, ToolName::WORDS);
    }
}
