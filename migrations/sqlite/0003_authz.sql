-- Per-participant grants beyond the role (JSON [{"capability","expires_at"}]) and removals
-- (comma-separated capability names); invites; the hash-chained audit log (one chain per room,
-- plus "system").
ALTER TABLE participants ADD COLUMN extra TEXT NOT NULL DEFAULT '[]';
ALTER TABLE participants ADD COLUMN removed TEXT NOT NULL DEFAULT '';

CREATE TABLE invites (
    token_hash  TEXT PRIMARY KEY,
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    role        TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    max_uses    INTEGER NOT NULL,
    uses        INTEGER NOT NULL DEFAULT 0,
    revoked_at  INTEGER
);
CREATE INDEX invites_room ON invites(room_id);

CREATE TABLE audit_log (
    chain       TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    decision    TEXT NOT NULL,
    reason      TEXT NOT NULL,
    details     TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    PRIMARY KEY (chain, seq)
);
