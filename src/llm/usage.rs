//! [`Usage`]: token counts of one response, summed per session and per run, and their cost
//! from an optional price table. Parsed leniently: Cortex may leave out the detail objects.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::provider::Prices;

/// Token counts. `cached_tokens` is part of `input_tokens`; `reasoning_tokens` is part of
/// `output_tokens`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Reads the `usage` object of a response; missing fields count as zero.
    pub fn from_response(response: &Value) -> Self {
        let u = &response["usage"];
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        Self {
            input_tokens: n(&u["input_tokens"]),
            cached_tokens: n(&u["input_tokens_details"]["cached_tokens"]),
            output_tokens: n(&u["output_tokens"]),
            reasoning_tokens: n(&u["output_tokens_details"]["reasoning_tokens"]),
        }
    }

    /// `turn_finished.usage` as the agent records it (`input`, `cached`, `output`,
    /// `reasoning`); missing fields count as zero.
    pub fn from_turn(u: &crate::event::TurnUsage) -> Self {
        Self {
            input_tokens: u.input,
            cached_tokens: u.cached,
            output_tokens: u.output,
            reasoning_tokens: u.reasoning,
        }
    }

    /// Adds another response's counts to these.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.cached_tokens += other.cached_tokens;
        self.output_tokens += other.output_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }

    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// As `turn_finished.usage` records it (without a cost).
    pub fn to_turn(&self) -> crate::event::TurnUsage {
        crate::event::TurnUsage {
            input: self.input_tokens,
            cached: self.cached_tokens,
            output: self.output_tokens,
            reasoning: self.reasoning_tokens,
            total: self.total_tokens(),
            cost_usd: None,
        }
    }

    /// Cost in USD: uncached input at `input`, cached input at `cached_input` (or `input`
    /// when the table has none), output (reasoning included) at `output`.
    pub fn cost_usd(&self, prices: &Prices) -> f64 {
        let cached = self.cached_tokens.min(self.input_tokens);
        let uncached = self.input_tokens - cached;
        let per_token = |usd_per_million: f64| usd_per_million / 1_000_000.0;
        uncached as f64 * per_token(prices.input)
            + cached as f64 * per_token(prices.cached_input.unwrap_or(prices.input))
            + self.output_tokens as f64 * per_token(prices.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn lenient_parse_add_and_cost() {
        let full = Usage::from_response(&json!({"usage": {
            "input_tokens": 1000, "input_tokens_details": {"cached_tokens": 400},
            "output_tokens": 100, "output_tokens_details": {"reasoning_tokens": 60}}}));
        let lean =
            Usage::from_response(&json!({"usage": {"input_tokens": 10, "output_tokens": 5}}));
        let mut sum = full;
        sum.add(&lean);
        assert_eq!(
            sum,
            Usage {
                input_tokens: 1010,
                cached_tokens: 400,
                output_tokens: 105,
                reasoning_tokens: 60
            }
        );
        let prices = Prices {
            input: 1.0,
            cached_input: Some(0.1),
            output: 10.0,
        };
        let cost = full.cost_usd(&prices);
        assert!(
            (cost - (600.0 + 40.0 + 1000.0) / 1e6).abs() < 1e-12,
            "{cost}"
        );
        assert_eq!(Usage::from_response(&json!({})), Usage::default());
    }
}
