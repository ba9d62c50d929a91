//! The campaign-wide spending cap (`[campaign] max_tokens`, `max_cost_usd`).
//!
//! The scheduler polls a [`Meter`] while sessions run. The meter reads the `turn_finished`
//! events of the run (and of its `--mode all` pair, named in `run_started.pair`) from the
//! store, incrementally, and sums their usage; cost is priced with the provider's `[prices]`.
//! Reading the store, not counters held by sessions, keeps the cap right across resumes and
//! across the two halves of a pair: what was spent is what was recorded.
//!
//! The prices a run was started with are recorded among its settings (`provider.prices`, a
//! JSON object), so a view can price a finished run without its provider file.

/// The setting that records the provider's prices in `run_started.settings`.
pub const PRICES_SETTING: &str = "provider.prices";

use std::collections::BTreeMap;

use crate::config::limits::CampaignLimits;
use crate::config::provider::Prices;
use crate::event::{RunStarted, TurnFinished};
use crate::llm::Usage;
use crate::store::{Event, Store, StoreError};

/// The caps and the prices to hold spending to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Budget {
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
    /// Needed to enforce `max_cost_usd`; the CLI refuses that cap without them.
    pub prices: Option<Prices>,
}

impl Budget {
    pub fn new(limits: &CampaignLimits, prices: Option<Prices>) -> Self {
        Self {
            max_tokens: limits.max_tokens,
            max_cost_usd: limits.max_cost_usd,
            prices,
        }
    }

    /// Whether there is anything to enforce.
    pub fn is_capped(&self) -> bool {
        self.max_tokens.is_some() || self.max_cost_usd.is_some()
    }
}

/// The campaign's [`Meter`], shared by the scheduler (which polls it) and the sessions (which ask
/// it before each model turn), read up to the newest recorded turn. A session that finds the cap
/// reached ends before sending another request, so a cap is passed by at most the turns already
/// in flight, one per running session.
pub struct Gate {
    meter: std::sync::Mutex<Meter>,
    store: Store,
    run_id: String,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("run_id", &self.run_id)
            .finish()
    }
}

impl Gate {
    pub fn new(budget: Budget, store: Store, run_id: String) -> Self {
        Self {
            meter: std::sync::Mutex::new(Meter::new(budget)),
            store,
            run_id,
        }
    }

    /// Reads the turns recorded since the last read; why spending must stop, if a cap is
    /// reached.
    pub fn poll(&self) -> Result<Option<String>, StoreError> {
        crate::sync::guard(&self.meter).poll(&self.store, &self.run_id)
    }

    /// [`Gate::poll`] for a session: a store that cannot be read stops nothing (the
    /// scheduler's own poll reports it).
    pub fn reached(&self) -> Option<String> {
        self.poll().ok().flatten()
    }

    /// What was spent as of the last read, and the caps.
    pub fn spent(&self) -> (Spent, Budget) {
        let meter = crate::sync::guard(&self.meter);
        (meter.spent(), meter.budget().clone())
    }
}

/// What the campaign spent so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Spent {
    pub tokens: u64,
    /// `None` without prices.
    pub cost_usd: Option<f64>,
}

/// The price table a run recorded in its `run_started` settings, if its provider had one.
pub fn prices_of(run_started: &RunStarted) -> Option<Prices> {
    run_started
        .setting(PRICES_SETTING)
        .and_then(|text| serde_json::from_str(text).ok())
}

/// Sums the recorded usage of a run (and its pair) and says when a cap is reached: the one fold
/// of token spending, which the budget, the views and `compare` all read.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    budget: Budget,
    /// The last event read, per run.
    after: BTreeMap<String, i64>,
    usage: Usage,
    /// Tokens as the turns recorded their total (input and output where none was recorded).
    tokens: u64,
    /// The turns' cost: each turn's recorded cost, else its usage priced; `None` while no turn
    /// had either.
    cost_usd: Option<f64>,
}

impl Meter {
    pub fn new(budget: Budget) -> Self {
        Self {
            budget,
            ..Self::default()
        }
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The token counts folded so far.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Prices the turns folded from now on (a view learns them from `run_started`).
    pub fn set_prices(&mut self, prices: Option<Prices>) {
        self.budget.prices = prices;
    }

    pub fn spent(&self) -> Spent {
        let priced = self.budget.prices.as_ref().map(|_| 0.0);
        Spent {
            tokens: self.tokens,
            cost_usd: self.cost_usd.or(priced),
        }
    }

    /// Adds one recorded event's spending (only `turn_finished` spends).
    pub fn fold(&mut self, e: &Event) {
        let Some(turn) = e.payload_as::<TurnFinished>() else {
            return;
        };
        let usage = Usage::from_turn(&turn.usage);
        self.usage.add(&usage);
        self.tokens += match turn.usage.total {
            0 => usage.total_tokens(),
            total => total,
        };
        let priced = self.budget.prices.as_ref().map(|p| usage.cost_usd(p));
        if let Some(c) = turn.usage.cost_usd.or(turn.cost_usd).or(priced) {
            self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + c);
        }
    }

    /// Reads the events recorded since the last poll; returns why the campaign must stop,
    /// when a cap is reached.
    pub fn poll(&mut self, store: &Store, run_id: &str) -> Result<Option<String>, StoreError> {
        if self.after.is_empty() {
            self.after.insert(run_id.to_string(), 0);
            if let Some(pair) = store.pair_of(run_id)? {
                self.after.insert(pair, 0);
            }
        }
        let mut new = Vec::new();
        for (run, after) in self.after.iter_mut() {
            let events = store.events(run, None, *after)?;
            *after = events.last().map_or(*after, |e| e.seq);
            new.extend(events);
        }
        for e in &new {
            self.fold(e);
        }
        Ok(self.reached())
    }

    /// Why spending must stop, if a cap is reached.
    pub fn reached(&self) -> Option<String> {
        let spent = self.spent();
        if let Some(max) = self.budget.max_tokens
            && spent.tokens >= max
        {
            return Some(format!(
                "campaign token cap reached: {} tokens spent, campaign.max_tokens = {max}",
                spent.tokens
            ));
        }
        match (self.budget.max_cost_usd, spent.cost_usd) {
            (Some(max), Some(cost)) if cost >= max => Some(format!(
                "campaign cost cap reached: ${cost:.2} spent, campaign.max_cost_usd = {max}"
            )),
            _ => None,
        }
    }
}

impl Spent {
    /// This and `other` together (the two halves of a `--mode all` pair).
    pub fn plus(self, other: Spent) -> Spent {
        let cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        Spent {
            tokens: self.tokens + other.tokens,
            cost_usd,
        }
    }

    /// `21,607 tokens, $0.43` (or `cost unknown: no [prices]` without prices).
    pub fn describe(&self) -> String {
        let tokens = crate::inspect::group(self.tokens);
        match self.cost_usd {
            Some(c) => format!("{tokens} tokens, ${c:.2}"),
            None => format!("{tokens} tokens (cost unknown: the provider file has no [prices])"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn spending_is_described_with_grouped_tokens_and_dollars() {
        let priced = Spent {
            tokens: 1_234_567,
            cost_usd: Some(12.345),
        };
        assert_eq!(priced.describe(), "1,234,567 tokens, $12.35");
        let unpriced = Spent {
            tokens: 999,
            cost_usd: None,
        };
        assert_eq!(
            unpriced.describe(),
            "999 tokens (cost unknown: the provider file has no [prices])"
        );
    }

    #[test]
    fn the_cost_cap_fires_at_its_price() {
        let mut meter = Meter::new(Budget {
            max_tokens: None,
            max_cost_usd: Some(1.0),
            prices: Some(Prices {
                input: 1.0,
                cached_input: None,
                output: 10.0,
            }),
        });
        let turn = |input: u64, output: u64| Event {
            run_id: "r".into(),
            seq: 1,
            at: String::new(),
            kind: "turn_finished".into(),
            target: Some("L1/gelu".into()),
            payload: serde_json::json!({"usage": {"input": input, "output": output}}),
        };
        meter.fold(&turn(500_000, 40_000));
        assert_eq!(meter.reached(), None, "$0.90 is under the cap");
        meter.fold(&turn(0, 10_000));
        assert_eq!(
            meter.reached().as_deref(),
            Some("campaign cost cap reached: $1.00 spent, campaign.max_cost_usd = 1")
        );
    }
}
