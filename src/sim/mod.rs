//! The clearly labelled simulation: stand-ins for the external pieces so campaigns and tests run
//! without a token or a GPU — a scripted Responses server on loopback ([`server`], its faults
//! [`faults`], its script for codex clients [`codex`]), a simulated bench ([`bench`](mod@bench),
//! its noise model [`noise`], its log [`invocations`], and [`in_process`] to run it inside a
//! test on a paused clock), a simulated
//! `fastkernels eval` ([`eval`]), and the provider and baselines a simulated campaign uses
//! ([`setup`]); fake GPUs are declared to the real broker. Only stand-ins: [`crate::app`]
//! assembles them into a campaign. Every output of a simulated run says SIMULATED.

pub mod bench;
pub mod codex;
pub mod eval;
pub mod faults;
pub mod in_process;
pub mod invocations;
pub mod noise;
pub mod server;
pub mod setup;
