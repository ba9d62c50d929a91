//! The clearly labelled simulation: stand-ins for the external pieces so campaigns and tests run
//! without a token or a GPU — a scripted Responses server on loopback ([`server`]) and a
//! simulated bench ([`bench`]); fake GPUs are declared to the real broker. Every output of a
//! simulated run says SIMULATED.

pub mod bench;
pub mod campaign;
pub mod server;
