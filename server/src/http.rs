//! The HTTP and WebSocket edge: extractors, the authorization guard, the one mapping of errors
//! to responses, and one module per resource, each with its `routes()`. The edge imports the
//! domain (`room`, `terminal`, `sandbox`, `accounts`); nothing outside `http` imports it (see
//! `docs/design.md` and the `layers` test).

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod agents;
pub(crate) mod approvals;
pub(crate) mod bucket;
pub(crate) mod checkpoints;
pub(crate) mod deletion;
pub(crate) mod doc_socket;
pub(crate) mod e2b;
pub(crate) mod egress;
pub(crate) mod error;
pub(crate) mod extract;
pub(crate) mod files;
pub(crate) mod forward;
pub(crate) mod guard;
pub(crate) mod health;
pub(crate) mod listener;
pub(crate) mod login;
pub(crate) mod mcp;
pub(crate) mod moderation;
pub(crate) mod previews;
pub(crate) mod reframe;
pub(crate) mod repos;
pub(crate) mod rooms;
pub(crate) mod sandbox;
pub(crate) mod secrets;
pub(crate) mod spend;
pub(crate) mod state;
pub(crate) mod terminal_socket;
pub(crate) mod trash;
pub(crate) mod upgrade;
pub(crate) mod web;

pub(crate) use error::ApiError;
pub(crate) use extract::AuthUser;
pub(crate) use state::AppState;

use axum::extract::DefaultBodyLimit;
use axum::Router;

/// Largest JSON body the API accepts.
const MAX_API_BODY: usize = 64 << 10;

/// Every route of the server.
pub(crate) fn router(state: AppState) -> Router {
    let routes = Router::new()
        .merge(login::routes(&state))
        .merge(health::routes())
        .merge(rooms::routes())
        .merge(deletion::routes())
        .merge(admin::routes())
        .merge(access::routes())
        .merge(approvals::routes())
        .merge(doc_socket::routes())
        .merge(terminal_socket::routes())
        .merge(sandbox::routes())
        .merge(checkpoints::routes())
        .merge(trash::routes())
        .merge(secrets::routes())
        .merge(egress::routes())
        .merge(repos::routes())
        .merge(previews::routes())
        .merge(spend::routes())
        .merge(moderation::routes())
        .merge(agents::routes())
        .merge(e2b::routes())
        .layer(DefaultBodyLimit::max(MAX_API_BODY))
        // File contents are bigger than API bodies.
        .merge(files::routes())
        // The MCP endpoint reads its own bodies (rmcp caps them).
        .merge(mcp::routes(&state))
        // The client's assets (a megabyte of JavaScript) go out gzipped to browsers that ask.
        .fallback_service(tower_http::compression::Compression::new(
            axum::handler::Handler::with_state(web::fallback, state.clone()),
        ))
        // A room another server owns is served there (scale-out).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        .with_state(state.clone());
    // The E2B SDKs' own host shape is mapped onto the routes above before they are matched.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn_with_state(state, e2b::wildcard))
}
