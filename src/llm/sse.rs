//! SSE parsing of a Responses stream, leniently: events are read as a flat struct whose
//! fields are all optional, unknown event types and unknown item types are skipped or kept,
//! never fatal. Items come from `response.output_item.done` (the authoritative full item) and
//! are kept as raw JSON; the turn ends only on a terminal event.
//!
//! [`Assembler`] is the pure state machine (one event in, deltas out); [`read_events`] drives
//! it over a byte stream with the idle timeout (tokio time).

use std::borrow::Cow;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::error::{classify_failure, json_text as text};
use super::{LlmError, LlmEvent, Usage};

/// A finished response.
#[derive(Clone, Debug, PartialEq)]
pub struct Completed {
    pub response_id: String,
    pub output: Vec<Value>,
    pub usage: Usage,
}

#[derive(Deserialize)]
struct Ev<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

/// Builds one response from its events.
#[derive(Debug, Default)]
pub struct Assembler {
    /// (output_index, arrival order, item)
    items: Vec<(u64, usize, Value)>,
}

impl Assembler {
    /// Feeds one SSE event (`name` is the `event:` field, used when the data has no `type`).
    /// Returns the outcome on a terminal event, `None` otherwise.
    pub fn feed(
        &mut self,
        name: &str,
        data: &str,
        sink: &mut impl FnMut(LlmEvent),
    ) -> Option<Result<Completed, LlmError>> {
        let Ok(ev) = serde_json::from_str::<Ev<'_>>(data) else {
            return None;
        };
        let kind = ev.kind.as_deref().unwrap_or(name);
        match kind {
            "response.output_text.delta" => {
                sink(LlmEvent::TextDelta {
                    item_id: ev.item_id.unwrap_or_default().into_owned(),
                    delta: ev.delta.unwrap_or_default().into_owned(),
                });
                None
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                sink(LlmEvent::ReasoningDelta {
                    item_id: ev.item_id.unwrap_or_default().into_owned(),
                    delta: ev.delta.unwrap_or_default().into_owned(),
                });
                None
            }
            "response.output_item.done" => {
                let item: Value = serde_json::from_str(ev.item?.get()).ok()?;
                let order = self.items.len();
                let index = ev.output_index.unwrap_or(order as u64);
                self.items.push((index, order, item));
                None
            }
            "response.completed" => Some(self.complete(ev.response)),
            "response.failed" => {
                let response = parse(ev.response);
                let err = &response["error"];
                Some(Err(classify_failure(
                    text(&err["code"]),
                    text(&err["message"]).unwrap_or_else(|| "response.failed".into()),
                )))
            }
            "response.incomplete" => {
                let response = parse(ev.response);
                let reason = text(&response["incomplete_details"]["reason"])
                    .unwrap_or_else(|| "unknown".into());
                Some(Err(LlmError::Incomplete { reason }))
            }
            "error" => {
                let v: Value = serde_json::from_str(data).unwrap_or_default();
                let err = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
                Some(Err(classify_failure(
                    text(&err["code"]).or_else(|| text(&err["type"])),
                    text(&err["message"]).unwrap_or_else(|| "error event".into()),
                )))
            }
            _ => None,
        }
    }

    fn complete(&mut self, response: Option<&RawValue>) -> Result<Completed, LlmError> {
        let response = parse(response);
        let mut items = std::mem::take(&mut self.items);
        items.sort_by_key(|(index, order, _)| (*index, *order));
        let mut output: Vec<Value> = items.into_iter().map(|(_, _, item)| item).collect();
        if output.is_empty() {
            // Some gateways send the items only inside the final response.
            output = response["output"].as_array().cloned().unwrap_or_default();
        }
        Ok(Completed {
            response_id: response["id"].as_str().unwrap_or("").to_string(),
            usage: Usage::from_response(&response),
            output,
        })
    }
}

fn parse(raw: Option<&RawValue>) -> Value {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default()
}

/// Reads a Responses SSE byte stream to its terminal event. Each gap between events longer
/// than `idle` fails with [`LlmError::IdleTimeout`]; an end without a terminal event fails
/// with [`LlmError::StreamClosed`]. Both are retryable.
pub async fn read_events<S, B, E>(
    bytes: S,
    idle: Duration,
    mut sink: impl FnMut(LlmEvent),
) -> Result<Completed, LlmError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let mut events = std::pin::pin!(bytes.eventsource());
    let mut assembler = Assembler::default();
    loop {
        let next = tokio::time::timeout(idle, events.next())
            .await
            .map_err(|_| LlmError::IdleTimeout { after: idle })?;
        match next {
            None => {
                return Err(LlmError::StreamClosed {
                    items: assembler.items.len(),
                });
            }
            Some(Err(e)) => {
                return Err(LlmError::Transport {
                    message: format!("reading the event stream: {e}"),
                });
            }
            Some(Ok(event)) => {
                if let Some(outcome) = assembler.feed(&event.event, &event.data, &mut sink) {
                    return outcome;
                }
            }
        }
    }
}
