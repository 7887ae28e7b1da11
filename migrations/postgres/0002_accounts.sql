-- Email login: one live code per email (argon2id hash only), issuance history for per-email
-- caps, session idle expiry, disabled accounts, and auth events (absorbed by the audit chain
-- of the authorization layer later).
ALTER TABLE users ADD COLUMN disabled_at BIGINT;
ALTER TABLE sessions ADD COLUMN last_seen_at BIGINT NOT NULL DEFAULT 0;

CREATE TABLE login_codes (
    email       TEXT PRIMARY KEY,
    code_hash   TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    attempts    BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE code_issuance (
    email       TEXT NOT NULL,
    at          BIGINT NOT NULL
);
CREATE INDEX code_issuance_email_at ON code_issuance(email, at);

CREATE TABLE auth_events (
    at          BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    email       TEXT,
    user_id     TEXT,
    ip          TEXT
);
CREATE INDEX auth_events_at ON auth_events(at);
