//! Sessions end to end through the library's public API, in one test binary: encrypted and
//! sealed sessions, jobs, the live optimiser, a receiver's events and its stop, tenants, and
//! striped transfers.
//!
//! One binary rather than one per file: each integration test binary links the whole crate and
//! its dependencies again, so seven of them linked seven times what one links once.
//! Tests that count the process's threads (receiver_threads, quic_threads) or build without
//! the default features (lean_build) keep their own binaries.

#[path = "../common/mod.rs"]
mod common;

mod encrypted;
mod integrity;
mod job;
mod live_optimizer;
mod receiver_events;
mod receiver_stop;
mod striped;
mod tenants;
