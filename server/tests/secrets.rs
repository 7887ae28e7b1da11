//! Room secrets (issue 16, first part): added by `add_secret` holders, listed by rule and never
//! by value, sealed at rest under a key outside the database, and rotated by
//! `coderoom secrets rotate-key`, after which the old key opens nothing. The value is searched
//! for in every artifact of the run: responses, the audit chain, the server's debug log, and
//! every file of the data directory (database, WAL, snapshots, recordings).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;

async fn call(
    server: &Server,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    http(&server.url(path), method, Some(token), body).await
}

/// `call`, asserting the status; what was answered is kept in `seen`.
async fn ask(
    server: &Server,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    want: u16,
    seen: &mut String,
) -> String {
    let (status, text) = call(server, token, method, path, body).await;
    assert_eq!(status, want, "{method} {path}: {text}");
    seen.push_str(&text);
    text
}

async fn secrets_are_sealed_listed_by_rule_and_rotated_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let log = storage.dir.path().join("server.log");
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let server = Server::start_logging_to(&storage, &log).await;
    let room = create_room(&server, &ana).await;
    let (status, inv) = invite(&server, &ana, &room, "editor", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&server, &ben, &inv).await, 200);
    let value = format!("sk-live-{}", uuid::Uuid::new_v4().simple());
    let path = format!("/api/rooms/{room}/secrets");
    let body = |name: &str, hosts: &str, format: &str| {
        format!(
            r#"{{"name":"{name}","value":"{value}","hosts":{hosts},"header":"Authorization","format":"{format}"}}"#
        )
    };
    let mut responses = String::new();

    // Refused: without add_secret, and with a bad rule.
    ask(
        &server,
        &ben,
        "POST",
        &path,
        Some(&body("API_KEY", r#"["api.example.com"]"#, "Bearer {}")),
        403,
        &mut responses,
    )
    .await;
    for (name, hosts, format) in [
        ("api-key", r#"["api.example.com"]"#, "Bearer {}"),
        ("API_KEY", r#"["127.0.0.1"]"#, "Bearer {}"),
        ("API_KEY", r#"[]"#, "Bearer {}"),
        ("API_KEY", r#"["api.example.com"]"#, "Bearer"),
    ] {
        let (status, text) = call(
            &server,
            &ana,
            "POST",
            &path,
            Some(&body(name, hosts, format)),
        )
        .await;
        assert_eq!(status, 400, "{name} {hosts} {format}: {text}");
        responses.push_str(&text);
    }
    // Added: the answer is the rule.
    let text = ask(
        &server,
        &ana,
        "POST",
        &path,
        Some(&body(
            "API_KEY",
            r#"["api.example.com","*.models.example"]"#,
            "Bearer {}",
        )),
        201,
        &mut responses,
    )
    .await;
    let rule: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rule["name"], "API_KEY");
    assert_eq!(
        rule["hosts"],
        serde_json::json!(["*.models.example", "api.example.com"])
    );
    // Listed by anyone in the room, by rule; in the room's manifest too.
    let (status, text) = call(&server, &ben, "GET", &path, None).await;
    assert_eq!(status, 200);
    responses.push_str(&text);
    let listed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["header"], "Authorization");
    let (_, text) = call(&server, &ana, "GET", &format!("/api/rooms/{room}"), None).await;
    responses.push_str(&text);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["secret_rules"][0]["name"], "API_KEY");
    // Replaced under the same name; removed; a name that is not there is 404.
    ask(
        &server,
        &ana,
        "POST",
        &path,
        Some(&body("API_KEY", r#"["api.example.com"]"#, "token {}")),
        201,
        &mut responses,
    )
    .await;
    let (status, text) = call(
        &server,
        &ana,
        "POST",
        &path,
        Some(&body("OTHER", r#"["other.example.com"]"#, "{}")),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    assert_eq!(
        call(&server, &ben, "DELETE", &format!("{path}/OTHER"), None)
            .await
            .0,
        403
    );
    assert_eq!(
        call(&server, &ana, "DELETE", &format!("{path}/OTHER"), None)
            .await
            .0,
        204
    );
    assert_eq!(
        call(&server, &ana, "DELETE", &format!("{path}/OTHER"), None)
            .await
            .0,
        404
    );
    let (_, text) = call(
        &server,
        &ana,
        "GET",
        &format!("/api/rooms/{room}/audit"),
        None,
    )
    .await;
    responses.push_str(&text);
    let audit: Value = serde_json::from_str(&text).unwrap();
    let count = |action: &str, decision: &str| {
        audit
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == action && r["decision"] == decision)
            .count()
    };
    // Three added (one a replacement), one removed; ben's two attempts refused and recorded.
    assert_eq!(count("add_secret", "allow"), 3, "{audit}");
    assert_eq!(count("remove_secret", "allow"), 1, "{audit}");
    assert_eq!(count("add_secret", "deny"), 2, "{audit}");
    // Where the room's policy asks (set by approve holders only), a secret waits for someone
    // else's approval of its rule; the value is sent again with the approval, and kept nowhere
    // meanwhile.
    let policy = format!("/api/rooms/{room}/secrets-policy");
    let (status, _) = call(
        &server,
        &ben,
        "PUT",
        &policy,
        Some(r#"{"add_needs_approval":true}"#),
    )
    .await;
    assert_eq!(status, 403);
    ask(
        &server,
        &ana,
        "PUT",
        &policy,
        Some(r#"{"add_needs_approval":true}"#),
        200,
        &mut responses,
    )
    .await;
    let text = ask(
        &server,
        &ana,
        "POST",
        &path,
        Some(&body("GATED", r#"["api.example.com"]"#, "Bearer {}")),
        202,
        &mut responses,
    )
    .await;
    let approval: Value = serde_json::from_str(&text).unwrap();
    let approval = approval["approval_id"].as_str().unwrap().to_owned();
    let dee = storage.token("dee@example.com").await;
    let (status, inv) = invite(&server, &ana, &room, "owner", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&server, &dee, &inv).await, 200);
    ask(
        &server,
        &dee,
        "POST",
        &format!("/api/rooms/{room}/approvals/{approval}/decision"),
        Some(r#"{"approve":true}"#),
        200,
        &mut responses,
    )
    .await;
    let with = |name: &str| {
        format!(
            r#"{{"name":"{name}","value":"{value}","hosts":["api.example.com"],"header":"Authorization","format":"Bearer {{}}","approval_id":"{approval}"}}"#
        )
    };
    let (status, _) = call(&server, &ana, "POST", &path, Some(&with("OTHER_NAME"))).await;
    assert_eq!(status, 403, "an approval covers its own rule only");
    ask(
        &server,
        &ana,
        "POST",
        &path,
        Some(&with("GATED")),
        201,
        &mut responses,
    )
    .await;
    let (status, _) = call(&server, &ana, "POST", &path, Some(&with("GATED"))).await;
    assert_eq!(status, 403, "an approval is spent once");
    let view: Value = serde_json::from_str(
        &call(&server, &ana, "GET", &format!("/api/rooms/{room}"), None)
            .await
            .1,
    )
    .unwrap();
    assert_eq!(view["secrets_need_approval"], true);

    // Nothing in the sandbox either.
    let (_, out) = exec(
        &server,
        &ana,
        &room,
        "env; cat /proc/*/environ 2>/dev/null; echo done",
    )
    .await;
    assert!(out["stdout"].as_str().unwrap().ends_with("done\n"));
    responses.push_str(&out.to_string());
    assert!(server.terminate().await.success());

    assert!(!responses.contains(&value), "a response carried the value");
    let key = storage.dir.path().join("secret.key");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        std::fs::metadata(&log).unwrap().len() > 1000,
        "the debug log is missing"
    );
    no_file_holds(storage.dir.path(), &value);

    // The key opens every secret; after a rotation the new one does and the old one does not.
    let (ok, text) = storage.cli(&["secrets", "verify"]).await;
    assert!(ok && text.contains("ok: 2 secret(s)"), "{text}");
    let old = storage.dir.path().join("old.key");
    std::fs::copy(&key, &old).unwrap();
    let (ok, text) = storage.cli(&["secrets", "rotate-key"]).await;
    assert!(
        ok && text.contains("ok: 2 secret(s) sealed again"),
        "{text}"
    );
    assert_ne!(std::fs::read(&key).unwrap(), std::fs::read(&old).unwrap());
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (ok, text) = storage.cli(&["secrets", "verify"]).await;
    assert!(ok, "{text}");
    let (ok, text) = storage
        .cli(&[
            "secrets",
            "verify",
            "--secret-key-file",
            old.to_str().unwrap(),
        ])
        .await;
    assert!(
        !ok && text.contains("FAILED"),
        "the old key still opens them: {text}"
    );
    assert!(!text.contains(&value));

    // An interrupted rotation is finished by running it again, whichever side of its
    // transaction it stopped on. Before the transaction: the new key is beside the current
    // one, the secrets still under the current one; the rerun takes that new key.
    let next = storage.dir.path().join("secret.key.next");
    let before = storage.dir.path().join("before.key");
    std::fs::copy(&key, &before).unwrap();
    let pending = format!("{}\n", "ab".repeat(32));
    std::fs::write(&next, &pending).unwrap();
    let rotated_again = || async {
        let (ok, text) = storage.cli(&["secrets", "rotate-key"]).await;
        assert!(
            ok && text.contains("ok: 2 secret(s) sealed again"),
            "{text}"
        );
    };
    rotated_again().await;
    assert_eq!(std::fs::read_to_string(&key).unwrap(), pending);
    assert!(!next.exists());
    let (ok, text) = storage.cli(&["secrets", "verify"]).await;
    assert!(ok, "{text}");
    let verify_with = |k: &std::path::Path| {
        let k = k.to_str().unwrap().to_owned();
        let storage = &storage;
        async move {
            storage
                .cli(&["secrets", "verify", "--secret-key-file", &k])
                .await
        }
    };
    assert!(
        !verify_with(&before).await.0,
        "the key before still opens them"
    );
    // After the transaction, before the new key took the current one's place: the secrets are
    // under the new key, which the server and `verify` find beside the current one; the rerun
    // puts it in place.
    std::fs::copy(&key, &before).unwrap();
    let (ok, text) = storage.cli(&["secrets", "rotate-key"]).await;
    assert!(ok, "{text}");
    let sealed_under = std::fs::read_to_string(&key).unwrap();
    std::fs::rename(&key, &next).unwrap();
    std::fs::copy(&before, &key).unwrap();
    let (ok, text) = storage.cli(&["secrets", "verify"]).await;
    assert!(ok, "the new key beside the current one opens them: {text}");
    rotated_again().await;
    assert_eq!(std::fs::read_to_string(&key).unwrap(), sealed_under);
    assert!(!next.exists());
    assert!(
        !verify_with(&before).await.0,
        "the key before still opens them"
    );
    assert!(storage.cli(&["secrets", "verify"]).await.0);

    // Without its key, a server holding secrets does not start (a new key would open none).
    let aside = storage.dir.path().join("aside.key");
    std::fs::rename(&key, &aside).unwrap();
    let (ok, text) = storage.cli(&["serve", "--listen", "127.0.0.1:0"]).await;
    assert!(
        !ok && text.contains("is missing, but 2 secret(s) are stored"),
        "{text}"
    );
    assert!(!key.exists());
    std::fs::rename(&aside, &key).unwrap();
    // The server starts with the rotated key; deleting the room destroys its secrets.
    let root = storage.token("root@example.com").await;
    let server = Server::start(&storage, &["--admin-emails", "root@example.com"]).await;
    let listed = get_json(&server, &ana, &path).await;
    assert_eq!(listed[0]["format"], "token {}");
    let receipt = delete_room(&server, &ana, &root, &room).await;
    let secrets = receipt["receipt"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifact"] == "secrets")
        .cloned()
        .unwrap();
    assert_eq!(secrets["status"], "destroyed", "{receipt}");
    let (ok, text) = storage.cli(&["secrets", "verify"]).await;
    assert!(ok && text.contains("ok: 0 secret(s)"), "{text}");
}

on_each_backend!(
    secrets_are_sealed_listed_by_rule_and_rotated,
    secrets_are_sealed_listed_by_rule_and_rotated_on
);
