//! The browser client: static assets built from `web/` and embedded at compile time.
//!
//! Every path outside `/api/` that is not an asset is an app route (`/rooms/{id}`,
//! `/invite/{token}`, ...) and gets `index.html`, which routes on the client. Assets under
//! `/assets/` carry a content hash in their name, so they are cached for good; `index.html` is
//! never cached. Every answer carries a strict Content-Security-Policy: scripts only from this
//! origin, connections only to this origin, no framing.

use crate::http::AppState;
use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// Served when the binary was built without the client (`CODEROOM_SKIP_WEB_BUILD=1`).
const NOT_BUILT: &str = "<!doctype html><meta charset=utf-8><title>Coderoom</title>\
<p>This server was built without its browser client. Build it with <code>cd web &amp;&amp; npm ci \
&amp;&amp; npm run build</code>, then rebuild the server (<code>cargo build</code>). The API \
under <code>/api/</code> works regardless.</p>";

fn asset(path: &str) -> Option<&'static [u8]> {
    ASSETS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, bytes)| *bytes)
}

fn mime(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The router's fallback: assets, then the app shell, and a JSON 404 under `/api/`.
pub(crate) async fn fallback(State(app): State<AppState>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    if path.starts_with("/api/") || path == "/api" {
        return crate::http::ApiError::NotFound.into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let rel = path.trim_start_matches('/');
    let (rel, bytes) = match asset(rel) {
        Some(bytes) if !rel.is_empty() => (rel, bytes),
        // A missing file under /assets/ is a 404, not the shell (a stale tab asking for an
        // old bundle must fail visibly).
        _ if rel.starts_with("assets/") => return StatusCode::NOT_FOUND.into_response(),
        _ => match asset("index.html") {
            Some(bytes) => ("index.html", bytes),
            None => ("index.html", NOT_BUILT.as_bytes()),
        },
    };
    let cache = if rel.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut res = (
        [
            (header::CONTENT_TYPE, mime(rel)),
            (header::CACHE_CONTROL, cache),
        ],
        bytes,
    )
        .into_response();
    let h = res.headers_mut();
    // The origin was validated at start; should it still not make a header, the policy stays
    // strict without the WebSocket source rather than being left out.
    let frames = app.previews.origin.as_ref().map(|o| o.frame_source());
    let csp =
        HeaderValue::from_str(&csp(&app.public_origin, frames.as_deref())).unwrap_or_else(|_| {
            HeaderValue::from_static(
                "default-src 'self'; object-src 'none'; frame-ancestors 'none'",
            )
        });
    h.insert(header::CONTENT_SECURITY_POLICY, csp);
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

/// Scripts, connections and everything else from this origin only (plus its WebSocket form);
/// inline styles are allowed because CodeMirror and xterm.js set them. Frames: only previews
/// (`frames`, the preview origin's wildcard), for the preview pane.
fn csp(public_origin: &str, frames: Option<&str>) -> String {
    let ws = public_origin
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    let frames = frames.unwrap_or("'none'");
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; font-src 'self' data:; connect-src 'self' {ws}; \
         frame-src {frames}; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'"
    )
}

#[cfg(test)]
mod tests {
    use super::{csp, mime};

    #[test]
    fn types_and_policy() {
        assert_eq!(
            mime("assets/index-abc.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(mime("index.html"), "text/html; charset=utf-8");
        assert_eq!(mime("weird"), "application/octet-stream");
        let p = csp("https://rooms.example.com", None);
        assert!(p.contains("connect-src 'self' wss://rooms.example.com;"));
        assert!(p.contains("frame-src 'none';"));
        let p = csp(
            "https://rooms.example.com",
            Some("https://*.preview.example.net"),
        );
        assert!(p.contains("frame-src https://*.preview.example.net;"));
        assert!(p.contains("script-src 'self';"));
        assert!(p.contains("frame-ancestors 'none'"));
    }
}
