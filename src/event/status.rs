//! The status vocabulary, each word written and parsed here only: how a session ended
//! ([`SessionStatus`]: `PASS`, `FAIL`, … in events; `finished`, `failed`, … as a session
//! row's state), how a run ended ([`RunOutcome`]: `run_finished.status`) and where a run
//! stands ([`RunState`]: the `runs` table). The readable ends and verdicts that `sessions`
//! prints are derived from these in [`crate::inspect`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How one session ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// The agent finished with a candidate.
    Finished,
    /// The session ran and failed (fatal provider error, no candidate, …).
    Failed,
    /// The session timeout fired.
    TimedOut,
    /// The daemon stopped it (stop, SIGINT/SIGTERM); it can be resumed.
    Interrupted,
    /// Not run on this host, with the reason (e.g. `missing: vllm`).
    Skipped(String),
}

impl SessionStatus {
    /// The status word of `session_finished`, `task_finished` and `run_finished`
    /// (`SKIP(reason)` for skips).
    pub fn word(&self) -> String {
        match self {
            Self::Finished => "PASS".into(),
            Self::Failed => "FAIL".into(),
            Self::TimedOut => "TIMEOUT".into(),
            Self::Interrupted => "INTERRUPTED".into(),
            Self::Skipped(why) => format!("SKIP({why})"),
        }
    }

    /// The status of a recorded word; `None` for a word no release wrote.
    pub fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "PASS" => Self::Finished,
            "FAIL" => Self::Failed,
            "TIMEOUT" => Self::TimedOut,
            "INTERRUPTED" => Self::Interrupted,
            w => Self::Skipped(w.strip_prefix("SKIP(")?.strip_suffix(')')?.to_string()),
        })
    }

    /// The state shown by `sessions` (and kept in the session's row).
    pub fn state(&self) -> SessionState {
        match self {
            Self::Finished => SessionState::Finished,
            Self::Failed => SessionState::Failed,
            Self::TimedOut => SessionState::TimedOut,
            Self::Interrupted => SessionState::Interrupted,
            Self::Skipped(_) => SessionState::Skipped,
        }
    }

    /// The end a session row's state records (`skip_reason` for a skip); `None` for the
    /// states of a session without an end (queued, running, interrupted, …).
    pub fn from_state(state: SessionState, skip_reason: &str) -> Option<Self> {
        Some(match state {
            SessionState::Finished => Self::Finished,
            SessionState::Failed => Self::Failed,
            SessionState::TimedOut => Self::TimedOut,
            SessionState::Skipped => Self::Skipped(skip_reason.to_string()),
            _ => return None,
        })
    }
}

/// A payload field holding a [`SessionStatus`] as its word; a word this release does not
/// know is kept as it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusWord {
    Known(SessionStatus),
    Unknown(String),
}

impl StatusWord {
    pub fn status(&self) -> Option<&SessionStatus> {
        match self {
            Self::Known(s) => Some(s),
            Self::Unknown(_) => None,
        }
    }

    pub fn word(&self) -> String {
        match self {
            Self::Known(s) => s.word(),
            Self::Unknown(w) => w.clone(),
        }
    }
}

impl From<SessionStatus> for StatusWord {
    fn from(s: SessionStatus) -> Self {
        Self::Known(s)
    }
}

impl Serialize for StatusWord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.word())
    }
}

impl<'de> Deserialize<'de> for StatusWord {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = String::deserialize(d)?;
        Ok(SessionStatus::from_word(&w).map_or(Self::Unknown(w), Self::Known))
    }
}

/// How a run (or a phase of it) ended: `run_finished.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunOutcome {
    /// Every session finished (or was skipped).
    Pass,
    /// Stopped before its end; `resume` goes on.
    Interrupted,
    /// A session failed or timed out, or the run failed outside its sessions (and any word
    /// this release does not know).
    #[serde(other)]
    Fail,
}

crate::words!(RunOutcome {
    Pass = "PASS",
    Fail = "FAIL",
    Interrupted = "INTERRUPTED",
});

impl RunOutcome {
    /// The recorded word (`PASS`, …). Read back, serde takes a word this release does not know
    /// as `Fail`; `from_word` gives `None` for it.
    pub fn word(self) -> &'static str {
        self.as_str()
    }

    /// The run's state once it ended so.
    pub fn state(self) -> RunState {
        match self {
            Self::Pass => RunState::Finished,
            Self::Fail => RunState::Failed,
            Self::Interrupted => RunState::Interrupted,
        }
    }
}

/// A run's outcome against its recorded word (`PASS`, …): what scripts and tests compare.
impl PartialEq<&str> for RunOutcome {
    fn eq(&self, word: &&str) -> bool {
        self.word() == *word
    }
}

/// Where a session stands: the `state` of its row in the `sessions` table. A live session's
/// state names what it does; an ended one's is its end ([`SessionStatus::state`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionState {
    #[default]
    Queued,
    Running,
    Thinking,
    Validating,
    Profiling,
    Finished,
    Failed,
    TimedOut,
    Interrupted,
    Skipped,
}

crate::words!(serde SessionState {
    Queued = "queued",
    Running = "running",
    Thinking = "thinking",
    Validating = "validating",
    Profiling = "profiling",
    Finished = "finished",
    Failed = "failed",
    TimedOut = "timed out",
    Interrupted = "interrupted",
    Skipped = "skipped",
});

impl SessionState {
    /// An end (an interrupted session included): not queued, not live.
    pub fn is_end(self) -> bool {
        matches!(
            self,
            Self::Finished | Self::Failed | Self::TimedOut | Self::Interrupted | Self::Skipped
        )
    }

    /// Neither queued nor ended: the session runs.
    pub fn is_live(self) -> bool {
        self != Self::Queued && !self.is_end()
    }
}

/// Where a run stands: the `status` of its row in the `runs` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    Running,
    Finished,
    Failed,
    Interrupted,
}

crate::words!(serde RunState {
    Running = "running",
    Finished = "finished",
    Failed = "failed",
    Interrupted = "interrupted",
});

/// How the campaign schedules its targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every target at once, under the agent cap.
    Independent,
    /// Level by level, each level building on the winners of the levels below.
    Sequential,
    /// Independent, then sequential, then the comparison.
    All,
}

impl Mode {
    /// The short form used in run ids.
    pub fn short(self) -> &'static str {
        match self {
            Self::Independent => "ind",
            Self::Sequential => "seq",
            Self::All => "all",
        }
    }
}

crate::words!(serde Mode {
    Independent = "independent",
    Sequential = "sequential",
    All = "all",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_word_reads_back_as_itself() {
        for s in [
            SessionStatus::Finished,
            SessionStatus::Failed,
            SessionStatus::TimedOut,
            SessionStatus::Interrupted,
            SessionStatus::Skipped("missing: vllm".into()),
        ] {
            assert_eq!(SessionStatus::from_word(&s.word()), Some(s.clone()));
            let reason = match &s {
                SessionStatus::Skipped(r) => r.as_str(),
                _ => "",
            };
            if s != SessionStatus::Interrupted {
                assert_eq!(SessionStatus::from_state(s.state(), reason), Some(s));
            }
        }
        assert_eq!(SessionStatus::from_word("DONE"), None);
        let unknown = serde_json::from_value::<RunOutcome>("DONE".into()).unwrap();
        assert_eq!(unknown, RunOutcome::Fail);
        for o in [RunOutcome::Pass, RunOutcome::Fail, RunOutcome::Interrupted] {
            let v = serde_json::to_value(o).unwrap();
            assert_eq!(v, o.word());
            assert_eq!(serde_json::from_value::<RunOutcome>(v).unwrap(), o);
            assert_eq!(RunState::from_word(o.state().as_str()), Some(o.state()));
        }
    }
}
