//! fk-agentd: a daemon that runs a fleet of LLM agents optimizing fastkernels GPU kernels,
//! lends them GPUs through short leases, and scores what they produce.
//!
//! The map, in the order data flows (`cli → config → app → daemon → scheduler → session → store`):
//!
//! | module        | owns                                                                     |
//! |---------------|--------------------------------------------------------------------------|
//! | [`cli`]       | argument parsing, printing for humans, exit codes (the only printer)     |
//! | [`config`]    | `fk-agentd.toml` + env + flags → validated [`config::Config`]; provider files; the target selection and capture folder settled against what is there |
//! | [`target`]    | [`target::TargetId`] (`L1/rms_norm`), the catalog, selections (`L1-L3`, `captured`) |
//! | [`captures`]  | capture folders: the embedded default, their reports, per-target coverage, import |
//! | [`app`]       | the one assembler: opens a home (lock, store, broker keeping the provider token from children), builds real or simulated campaigns, `score` and the e2e eval |
//! | [`daemon`]    | lifecycle of a campaign on the parts app hands it: run creation, control socket, shutdown; the lock type |
//! | [`agent`]     | one session per target: turn loop, history, resume, compaction, GPU tools; the codex backend and its loopback relay (codex never holds the token) |
//! | [`scheduler`] | the only spawner of sessions: agent slots, start order, timeout, token/cost caps, run events |
//! | [`run`]       | run directories, the campaign mode, the journal (store first, then `run.jsonl`) |
//! | [`llm`]       | the Responses client: requests, SSE, retries, rate limits, token source, the token's redaction in every encoding |
//! | [`event`]     | the typed event log: each kind's payload struct, decoding, the status words (session, run state, campaign mode) |
//! | [`store`]     | SQLite (WAL, checkpointed when a run ends; refuses newer, foreign or tampered files): events, runs (ids, unique prefixes), sessions, lease journal; migrations |
//! | [`gpu`]       | the lease broker: inventory, queue, classes, deadlines, GPU cgroups, reclaim, health |
//! | [`control`]   | the axum API on `<home>/fk-agentd.sock` (0600, peer uid), its client, the daemon's status |
//! | [`dashboard`] | the web dashboard and `/metrics` on loopback: token, pages, SVG, SSE  |
//! | [`report`]    | pure renderers: tables and banners, data in, text out                     |
//! | [`inspect`]   | one session's events → a readable view; outcome words (end, verdict, scoring) |
//! | [`record`]    | a run read once for every view: sessions with end, verdict and scoring word, spend, GPU-seconds by class, scoring by the newest-complete rule |
//! | [`workspace`] | per-target directory, path jail, shell execution with timeout + truncation |
//! | [`tools`]     | tool specs the model sees, dispatch, apply_patch, the optimize prompt    |
//! | [`screen`]    | static reward-hack screen of a candidate file (rule, line, message)      |
//! | [`harness`]   | a private, verified copy of fastkernels (patch series chosen by `patches`); its static target catalog; the host preflight |
//! | [`sim`]       | the labelled simulation: scripted Responses server, simulated bench and eval |
//! | [`score`]     | bench driver (paired or published timing), A/A calibration and its statistics, winner gates (published; confirmed on the calibrated noise), composed and sequential benches, exported sets, e2e eval, `score.json` as one typed report with the one rule for which score counts, what scoring made of each target read back for views (independent scores, sequential level gates) |
//! | [`facts`]     | host/campaign facts (GPUs, stack, commits, provider, captures hash) as events |
//! | [`manifest`]  | MANIFEST.md / manifest.json of a run, rendered from recorded facts only   |
//! | [`protect`]   | hashes of baselines and bench harness; verify before every bench lease    |
//! | [`confine`]   | the Landlock ruleset that keeps secret files out of agent code's reach    |
//! | [`tls`]       | the process-wide rustls provider every HTTP client needs                  |
//! | [`error`]     | the crate [`Error`], gathering the module errors for the CLI             |
//! | [`exit`]      | the exit codes of the contract (a leaf: imports nothing of the crate)    |
//! | [`digest`]    | sha256 as hex, of bytes and of a folder's tree (a leaf)                 |
//! | [`words`]     | `words!`: the one table of an enum's words (`as_str`, `from_word`, `Display`; a leaf) |
//! | [`sync`]      | `guard`: a mutex lock that goes on past poisoning (a leaf)                |
//!
//! Invariants that cross modules: an event is stored before it is shown; the provider token is
//! never written anywhere; a bench's exit code is not its verdict; every simulated output says
//! it is simulated.

pub mod agent;
pub mod app;
pub mod captures;
pub mod cli;
pub mod config;
pub mod confine;
pub mod control;
pub mod daemon;
pub mod dashboard;
pub mod digest;
pub mod error;
pub mod event;
pub mod exit;
pub mod facts;
pub mod gpu;
pub mod harness;
pub mod inspect;
pub mod llm;
pub mod manifest;
pub mod protect;
pub mod record;
pub mod report;
pub mod run;
pub mod scheduler;
pub mod score;
pub mod screen;
pub mod sim;
pub mod store;
pub mod sync;
pub mod target;
pub mod tls;
pub mod tools;
pub mod words;
pub mod workspace;

pub use error::{Error, Result};
