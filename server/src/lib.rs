//! Coderoom room server: HTTP API, y-websocket document sync, durable storage.
//!
//! Layers (see `docs/design.md`): `http` is the edge; `room`, `terminal`, `sandbox` and
//! `accounts` (and `spend`, `egress`, ...) are the domain; `audit`, `store`, `config`, `metrics` and `registry` are below.
//! Imports run downward only.
#![forbid(unsafe_code)]

pub(crate) mod accounts;
pub(crate) mod audit;
pub mod cli;
pub(crate) mod clock;
pub(crate) mod close;
pub(crate) mod config;
pub(crate) mod egress;
pub(crate) mod fault;
pub(crate) mod http;
pub(crate) mod ids;
pub(crate) mod metrics;
pub(crate) mod ops;
pub(crate) mod registry;
pub(crate) mod repos;
pub mod room;
pub(crate) mod sandbox;
pub(crate) mod secrets;
pub(crate) mod serve;
pub(crate) mod spend;
pub(crate) mod store;
pub(crate) mod terminal;
#[cfg(test)]
#[path = "../tests/common/skip_log.rs"]
mod test_skip;
pub(crate) mod tiers;
