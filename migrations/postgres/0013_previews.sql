-- A room's previews: a port inside its sandbox served on the preview origin (--preview-url).
-- id is 128 random bits (hex): the public URL's only secret. state: active, pending_approval
-- (a public preview waiting for approval_id), revoked. Expired previews are past expires_at.
CREATE TABLE previews (
    id          TEXT PRIMARY KEY,
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    port        INTEGER NOT NULL,
    visibility  TEXT NOT NULL,
    state       TEXT NOT NULL,
    approval_id TEXT,
    ttl_ms      BIGINT NOT NULL,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX previews_room ON previews (room_id);
