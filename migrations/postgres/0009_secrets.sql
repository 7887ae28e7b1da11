-- Room secrets: each value sealed (XChaCha20-Poly1305) under the server's secret key, which
-- lives outside the database (--secret-key-file); key_id names the key that sealed it. The
-- rule says where the egress proxy may add it: hosts (a JSON array), the header and its format.
CREATE TABLE secrets (
    room_id      TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    hosts        TEXT NOT NULL,
    header       TEXT NOT NULL,
    format       TEXT NOT NULL,
    key_id       TEXT NOT NULL,
    nonce        BYTEA NOT NULL,
    sealed       BYTEA NOT NULL,
    created_by   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_used_at BIGINT,
    PRIMARY KEY (room_id, name)
);
