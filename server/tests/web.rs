//! The browser client's static assets, as `coderoom serve` serves them.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

/// Whether the client was built (the binary embeds `web/dist` as it was at compile time).
fn client_built() -> bool {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../web/dist/index.html")
        .exists()
}

#[tokio::test]
async fn the_app_shell_and_its_assets_are_served_with_a_strict_policy() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(&storage, &[]).await;

    let index = request(&server.url("/"), "GET", &[], None).await;
    assert_eq!(index.status, 200);
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(index.header("cache-control"), Some("no-cache"));
    assert_eq!(index.header("x-frame-options"), Some("DENY"));
    assert_eq!(index.header("x-content-type-options"), Some("nosniff"));
    let csp = index.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let port = server
        .url("/")
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(
        csp.contains(&format!("connect-src 'self' ws://127.0.0.1:{port};")),
        "{csp}"
    );

    if !client_built() {
        // Built with CODEROOM_SKIP_WEB_BUILD=1: the shell says how to build the client.
        assert!(
            index.body.contains("built without its browser client"),
            "{}",
            index.body
        );
        skip(
            Need::WebDist,
            "asset checks need the browser client built (web/dist)",
        );
        return;
    }
    let built = index.body.clone();
    assert!(built.contains(r#"<div id="app""#), "{built}");

    // App routes get the shell (the client routes them), so links open straight onto pages.
    for path in [
        "/rooms/abc123",
        "/invite/some-token",
        "/deletions/d1",
        "/login?next=%2F",
    ] {
        let r = request(&server.url(path), "GET", &[], None).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, built, "{path}");
    }

    // The bundle named by the shell, cached for good (its name carries its hash).
    let script = built
        .split("src=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap();
    assert!(script.starts_with("/assets/"), "{script}");
    let js = request(&server.url(script), "GET", &[], None).await;
    assert_eq!(js.status, 200);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(
        js.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    assert!(js.body.len() > 1000);
    assert_eq!(js.header("content-encoding"), None, "not asked for");
    // Gzipped for browsers that accept it.
    let gz = request(
        &server.url(script),
        "GET",
        &[("Accept-Encoding", "gzip")],
        None,
    )
    .await;
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert_eq!(gz.header("vary"), Some("accept-encoding"));

    // A missing asset is a 404, not the shell; so is a missing API route (as JSON).
    let missing = request(&server.url("/assets/nope-123.js"), "GET", &[], None).await;
    assert_eq!(missing.status, 404);
    let api = request(&server.url("/api/nope"), "GET", &[], None).await;
    assert_eq!(api.status, 404);
    assert!(api.body.contains("\"error\""), "{}", api.body);
    // The API keeps its own answers.
    let me = request(&server.url("/api/me"), "GET", &[], None).await;
    assert_eq!(me.status, 401);
    // Only reads.
    let post = request(&server.url("/rooms/abc"), "POST", &[], Some("{}")).await;
    assert_eq!(post.status, 405);
    assert_eq!(server.terminate().await.code(), Some(0));
}

/// The harness's own check: an answer that is not whole in time fails the test whatever its
/// status, so a server that sends a head and then hangs cannot pass a status-only check.
#[tokio::test]
#[should_panic(expected = "no whole answer within")]
async fn a_head_then_silence_fails_the_harness_request() {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let _ = conn
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
            .await;
        // Holds the connection open, saying nothing more.
        std::future::pending::<()>().await;
    });
    request_within(
        &url,
        "GET",
        &[],
        None,
        std::time::Duration::from_millis(500),
    )
    .await;
}
