//! The request body of one turn, built with async-openai's request types where they fit and
//! with the history spliced in as raw JSON (the typed input items lose unknown fields).
//!
//! Always: `stream: true`, `store: false`, `include: ["reasoning.encrypted_content"]`,
//! `reasoning: {effort, summary}`, `tool_choice: "auto"`, function tools only, and never
//! `previous_response_id` (Cortex keeps no state).

use async_openai::types::responses::{
    CreateResponse, FunctionTool, IncludeEnum, InputParam, Reasoning, ReasoningEffort as Effort,
    ReasoningSummary, Tool, ToolChoiceOptions, ToolChoiceParam,
};
use serde_json::Value;

use super::{LlmError, TurnRequest};
use crate::config::provider::{ProviderConfig, ReasoningEffort};

/// Serializes the body of `POST {base_url}/responses` for `req`.
pub fn build_body(provider: &ProviderConfig, req: &TurnRequest) -> Result<Vec<u8>, LlmError> {
    let typed = CreateResponse {
        model: Some(provider.model.clone()),
        instructions: (!req.instructions.is_empty()).then(|| req.instructions.clone()),
        input: InputParam::Items(Vec::new()),
        stream: Some(true),
        store: Some(false),
        include: Some(vec![IncludeEnum::ReasoningEncryptedContent]),
        reasoning: Some(Reasoning {
            effort: Some(effort(provider.reasoning_effort)),
            summary: Some(summary(&provider.reasoning_summary)?),
            ..Reasoning::default()
        }),
        tool_choice: Some(ToolChoiceParam::Option(ToolChoiceOptions::Auto)),
        parallel_tool_calls: Some(req.parallel_tool_calls),
        tools: Some(
            req.tools
                .iter()
                .map(|t| {
                    Tool::Function(FunctionTool {
                        name: t.name.clone(),
                        description: Some(t.description.clone()),
                        parameters: Some(t.parameters.clone()),
                        strict: Some(false),
                        ..FunctionTool::default()
                    })
                })
                .collect(),
        ),
        prompt_cache_key: req.prompt_cache_key.clone(),
        ..CreateResponse::default()
    };
    let bad = |e: serde_json::Error| LlmError::Config {
        field: "request".into(),
        value: provider.model.clone(),
        reason: format!("cannot serialize the request ({e})"),
    };
    let mut body = serde_json::to_value(&typed).map_err(bad)?;
    body["input"] = Value::Array(req.input.clone());
    serde_json::to_vec(&body).map_err(bad)
}

fn effort(e: ReasoningEffort) -> Effort {
    match e {
        ReasoningEffort::None => Effort::None,
        ReasoningEffort::Minimal => Effort::Minimal,
        ReasoningEffort::Low => Effort::Low,
        ReasoningEffort::Medium => Effort::Medium,
        ReasoningEffort::High => Effort::High,
        ReasoningEffort::Xhigh => Effort::Xhigh,
    }
}

fn summary(s: &str) -> Result<ReasoningSummary, LlmError> {
    match s {
        "auto" => Ok(ReasoningSummary::Auto),
        "concise" => Ok(ReasoningSummary::Concise),
        "detailed" => Ok(ReasoningSummary::Detailed),
        other => Err(LlmError::Config {
            field: "reasoning_summary".into(),
            value: other.into(),
            reason: "expected auto, concise or detailed".into(),
        }),
    }
}
