//! History items as raw JSON: builders for what we add (user messages, tool outputs) and
//! readers for what the model asked (function calls). Items from the server are never rebuilt
//! from these; they are kept as sent.

use serde::Serialize;
use serde_json::{Value, json};

/// A user message item.
pub fn user_message(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The answer to a function call; every call in the history needs one.
pub fn function_call_output(call_id: &str, output: &str) -> Value {
    json!({"type": "function_call_output", "call_id": call_id, "output": output})
}

/// A function call the model made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    pub call_id: String,
    pub name: String,
    /// The arguments as the JSON text the model wrote (may be invalid JSON: the tool layer
    /// reports that back to the model).
    pub arguments: String,
}

/// The function calls among `output`, in order. Items that are not function calls, or lack a
/// `call_id`/`name`, are skipped.
pub fn function_calls(output: &[Value]) -> Vec<FunctionCall> {
    output
        .iter()
        .filter(|item| item["type"] == "function_call")
        .filter_map(|item| {
            Some(FunctionCall {
                call_id: item["call_id"].as_str()?.to_string(),
                name: item["name"].as_str()?.to_string(),
                arguments: item["arguments"].as_str().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// The assistant's visible text in `output` (all `output_text` parts of message items).
pub fn output_text(output: &[Value]) -> String {
    let mut text = String::new();
    for item in output.iter().filter(|i| i["type"] == "message") {
        for part in item["content"].as_array().into_iter().flatten() {
            if part["type"] == "output_text" {
                text.push_str(part["text"].as_str().unwrap_or(""));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn reads_calls_and_text() {
        let output = vec![
            json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "e"}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_A", "name": "shell",
                   "arguments": "{\"cmd\":\"ls\"}", "status": "completed"}),
            json!({"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": "hi"}]}),
            json!({"type": "vendor_thing"}),
        ];
        assert_eq!(
            function_calls(&output),
            vec![FunctionCall {
                call_id: "call_A".into(),
                name: "shell".into(),
                arguments: "{\"cmd\":\"ls\"}".into()
            }]
        );
        assert_eq!(output_text(&output), "hi");
        assert_eq!(
            function_call_output("call_A", "42\n"),
            json!({"type": "function_call_output", "call_id": "call_A", "output": "42\n"})
        );
    }
}
