//! One integration-test binary (faster to link than one per file); each area is a module
//! under `tests/suite/`.

mod suite;
