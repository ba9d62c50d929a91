//! The embedded simulation, clearly labelled: a scripted Responses server on loopback
//! ([`server`]). Every output of a simulated run says SIMULATED.

pub mod server;
