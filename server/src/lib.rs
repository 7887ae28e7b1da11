//! Coderoom room server: HTTP API, y-websocket document sync, durable storage.
#![forbid(unsafe_code)]

pub mod access;
pub mod api;
pub mod app;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod config;
pub mod deletion;
pub mod email;
pub mod error;
pub mod filesync;
pub mod login;
pub mod mail;
pub mod metrics;
pub mod outbox;
pub mod presence;
pub mod protocol;
pub mod ratelimit;
pub mod registry;
pub mod room;
pub mod rooms;
pub mod sandbox;
pub mod sandbox_api;
pub mod store;
pub mod terminal;
pub mod web;
pub mod ws;
