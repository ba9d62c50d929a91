//! The scripted agent's moves for a codex client, served by the simulated Responses server
//! ([`super::server`]), which recognises codex by its shell tool, `exec_command`.
//!
//! The same script as a native simulated session, through codex's shell: look around (a
//! command that also prints its environment, so a test can see what a shell sees), write a
//! candidate, `fk-agentd tool validate`; if that failed, a second variant and validate again;
//! then `fk-agentd tool finish`, and a last message that ends codex's turn. Like the native
//! script it is stateless: the request's history says where the agent is. Every text it
//! writes says it is simulated.
//!
//! [`check_cortex_rules`] refuses what Cortex refuses (hosted tools, a `:` in the model id,
//! `store` other than false), for every client of the simulated server.

use serde_json::{Value, json};

use super::server::{Step, call, candidate_text, turn_items};

/// A codex request: its tools include `exec_command`.
pub fn is_codex(body: &Value) -> bool {
    body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["name"] == "exec_command"))
}

/// `Err(message)` for a request Cortex would answer with 400.
pub fn check_cortex_rules(body: &Value) -> Result<(), String> {
    if body["store"] != json!(false) {
        return Err(format!(
            "simulated Cortex: `store` must be false, got {}",
            body["store"]
        ));
    }
    let model = body["model"].as_str().unwrap_or("");
    if model.contains(':') {
        return Err(format!(
            "simulated Cortex: unknown model `{model}` (an effort goes in reasoning.effort)"
        ));
    }
    for tool in body["tools"].as_array().into_iter().flatten() {
        let kind = tool["type"].as_str().unwrap_or("");
        if kind != "function" && kind != "custom" {
            return Err(format!(
                "simulated Cortex: tool type `{kind}` is not supported (only function and custom tools)"
            ));
        }
    }
    Ok(())
}

/// The target, from the optimize prompt's title (`# Task: make `L1/gelu` faster`).
fn target_of(input: &[Value]) -> String {
    input
        .iter()
        .filter(|i| i["type"] == "message" && i["role"] == "user")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .find_map(|t| {
            let rest = t.split("# Task: make `").nth(1)?;
            Some(rest.split('`').next()?.to_string())
        })
        .unwrap_or_else(|| "L1/unknown".into())
}

fn command_of(item: &Value) -> String {
    let args: Value =
        serde_json::from_str(item["arguments"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
    args["cmd"].as_str().unwrap_or("").to_string()
}

/// Where the scripted codex agent is; `None` once it called `finish` (its turn ends).
fn next_move(input: &[Value]) -> Option<Step> {
    let commands: Vec<String> = input
        .iter()
        .filter(|i| i["type"] == "function_call" && i["name"] == "exec_command")
        .map(command_of)
        .collect();
    let last_output = input
        .iter()
        .rev()
        .find(|i| i["type"] == "function_call_output")
        .and_then(|i| i["output"].as_str())
        .unwrap_or("");
    let validations = commands
        .iter()
        .filter(|c| c.contains("fk-agentd tool validate"))
        .count() as u32;
    let writes = commands.iter().filter(|c| c.contains("cat > ")).count() as u32;
    Some(match commands.last() {
        None => Step::Explore,
        Some(c) if c.contains("fk-agentd tool finish") => return None,
        Some(c) if c.contains("fk-agentd tool validate") => {
            Step::after_validation(last_output, validations, writes + 1)
        }
        Some(c) if c.contains("cat > ") => Step::Validate,
        Some(_) if writes == 0 => Step::Write { variant: 1 },
        Some(_) => Step::Finish {
            passed: false,
            attempts: validations,
        },
    })
}

fn exec(cmd: String) -> Value {
    call("exec_command", json!({"cmd": cmd, "yield_time_ms": 30000}))
}

/// The output items of the next response to a codex request with this `input`.
pub fn items(input: &[Value], turn_id: &str, seed: u64) -> Vec<Value> {
    let target = target_of(input);
    let path = format!("candidate/{target}.py");
    let Some(step) = next_move(input) else {
        return vec![
            json!({"type": "message", "role": "assistant", "status": "completed",
            "id": format!("msg_sim_{}", &turn_id[..12]),
            "content": [{"type": "output_text", "annotations": [],
                         "text": "SIMULATED codex agent: finished."}]}),
        ];
    };
    let (thought, item) = match step {
        Step::Explore => (
            "Look at the workspace and what the shell sees.",
            exec("env | sort; ls -R .".into()),
        ),
        Step::Write { variant } => (
            "Write a fused kernel for the captured shapes.",
            exec(format!(
                "mkdir -p \"$(dirname {path})\" && cat > {path} <<'FK_SIM_EOF'\n{}FK_SIM_EOF",
                candidate_text(&target, variant, seed)
            )),
        ),
        Step::Validate => (
            "Validate the candidate on a leased GPU.",
            exec("fk-agentd tool validate".into()),
        ),
        Step::Finish { passed, attempts } => (
            "Done iterating.",
            exec(format!(
                "fk-agentd tool finish --summary 'SIMULATED codex agent: {} after {attempts} validation(s).'",
                if passed {
                    "candidate validated"
                } else {
                    "no passing candidate"
                }
            )),
        ),
    };
    turn_items(turn_id, thought, item)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_call(cmd: &str) -> Value {
        json!({"type": "function_call", "name": "exec_command", "arguments": json!({"cmd": cmd}).to_string()})
    }

    fn out(text: &str) -> Value {
        json!({"type": "function_call_output", "call_id": "c", "output": text})
    }

    #[test]
    fn the_codex_script_advances_through_the_shell() {
        let prompt = json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "# Task: make `L1/gelu` faster\n..."}]});
        assert_eq!(target_of(std::slice::from_ref(&prompt)), "L1/gelu");
        assert_eq!(
            next_move(std::slice::from_ref(&prompt)),
            Some(Step::Explore)
        );
        assert_eq!(
            next_move(&[exec_call("env | sort"), out("x")]),
            Some(Step::Write { variant: 1 })
        );
        assert_eq!(
            next_move(&[exec_call("cat > candidate/L1/gelu.py"), out("")]),
            Some(Step::Validate)
        );
        let failed = [
            exec_call("cat > a"),
            exec_call("fk-agentd tool validate"),
            out("INCORRECT"),
        ];
        assert_eq!(next_move(&failed), Some(Step::Write { variant: 2 }));
        let passed = [exec_call("fk-agentd tool validate"), out("PASSED 1.2x")];
        assert_eq!(
            next_move(&passed),
            Some(Step::Finish {
                passed: true,
                attempts: 1
            })
        );
        assert_eq!(
            next_move(&[exec_call("fk-agentd tool finish --summary s")]),
            None
        );
    }

    #[test]
    fn what_cortex_refuses_is_refused() {
        let ok = json!({"model": "m", "store": false, "tools": [{"type": "function"}, {"type": "custom"}]});
        assert!(check_cortex_rules(&ok).is_ok());
        let mut hosted = ok.clone();
        hosted["tools"][1] = json!({"type": "web_search"});
        assert!(
            check_cortex_rules(&hosted)
                .unwrap_err()
                .contains("web_search")
        );
        let mut suffixed = ok.clone();
        suffixed["model"] = json!("m:high");
        assert!(check_cortex_rules(&suffixed).is_err());
        let mut stored = ok;
        stored["store"] = json!(true);
        assert!(check_cortex_rules(&stored).is_err());
    }
}
