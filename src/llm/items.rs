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

/// What a provider that answered `invalid_encrypted_content` (after a token rotation to another
/// account) can no longer read: the encrypted reasoning it sealed before, and the ids of the
/// items it issued with it (an item echoed by id needs its reasoning beside it). Both are
/// left out of every later request; the items themselves stay, without their ids.
#[derive(Clone, Debug, Default)]
pub struct Forgotten {
    sealed: std::collections::HashSet<String>,
    ids: std::collections::HashSet<String>,
}

impl Forgotten {
    /// Forgets everything `input` holds that the provider sealed or issued. Returns the bytes
    /// of encrypted content that will be left out (0: nothing to forget).
    pub fn learn(&mut self, input: &[Value]) -> usize {
        let mut bytes = 0;
        for item in input {
            if let Some(sealed) = sealed(item) {
                bytes += sealed.len();
                self.sealed.insert(sealed.to_string());
            } else if let Some(id) = item["id"].as_str() {
                self.ids.insert(id.to_string());
            }
        }
        bytes
    }

    /// `input` without the forgotten reasoning, and the forgotten ids removed.
    pub fn apply(&self, input: &[Value]) -> Vec<Value> {
        input
            .iter()
            .filter(|item| sealed(item).is_none_or(|s| !self.sealed.contains(s)))
            .map(|item| {
                let mut item = item.clone();
                let forget = item["id"].as_str().is_some_and(|id| self.ids.contains(id));
                if let (true, Some(map)) = (forget, item.as_object_mut()) {
                    map.remove("id");
                }
                item
            })
            .collect()
    }
}

fn sealed(item: &Value) -> Option<&str> {
    (item["type"] == "reasoning")
        .then(|| item["encrypted_content"].as_str())
        .flatten()
}

/// `input` as a provider that lost its keys can take it ([`Forgotten`]), and the bytes of
/// encrypted reasoning left out.
pub fn without_encrypted_reasoning(input: &[Value]) -> (Vec<Value>, usize) {
    let mut forgotten = Forgotten::default();
    let bytes = forgotten.learn(input);
    (forgotten.apply(input), bytes)
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

    #[test]
    fn encrypted_reasoning_goes_and_everything_else_stays() {
        let input = vec![
            json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "abcd"}),
            json!({"type": "reasoning", "id": "rs_2", "summary": []}),
            json!({"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}),
            user_message("go"),
        ];
        let (kept, dropped) = without_encrypted_reasoning(&input);
        let mut unnamed = input[1].clone();
        unnamed.as_object_mut().unwrap().remove("id");
        assert_eq!(kept, vec![unnamed, input[2].clone(), input[3].clone()]);
        assert_eq!(dropped, 4);
        assert_eq!(without_encrypted_reasoning(&kept), (kept.clone(), 0));
        // Learned once, applied to a later request that echoes the old items and adds new ones.
        let mut forgotten = Forgotten::default();
        forgotten.learn(&input);
        let new = json!({"type": "reasoning", "id": "rs_3", "encrypted_content": "new"});
        let later = [input.clone(), vec![new.clone()]].concat();
        assert_eq!(forgotten.apply(&later), [kept, vec![new]].concat());
    }
}
