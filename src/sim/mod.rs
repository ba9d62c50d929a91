//! The clearly labelled simulation: stand-ins for the external pieces (Responses server, bench,
//! GPUs) so campaigns and tests run without a token or a GPU. Every output says it is simulated.

pub mod bench;
