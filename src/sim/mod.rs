//! The clearly labelled simulation: stand-ins for the external pieces so campaigns and tests run
//! without a token or a GPU — a scripted Responses server on loopback ([`server`]) and a
//! simulated bench ([`bench`](mod@bench), its noise model [`noise`], and [`in_process`] to run it inside a
//! test on a paused clock), a simulated `fastkernels eval` ([`eval`]); fake GPUs are declared to the real broker. Every output of a
//! simulated run says SIMULATED.

pub mod bench;
pub mod campaign;
pub mod eval;
pub mod faults;
pub mod in_process;
pub mod invocations;
pub mod noise;
pub mod server;
