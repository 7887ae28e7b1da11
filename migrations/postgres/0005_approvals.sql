-- Requests that need another participant's approval, bound to their exact parameters.
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    requester   TEXT NOT NULL,
    action      TEXT NOT NULL,
    params      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    decided_by  TEXT,
    decided_at  BIGINT,
    approved    BIGINT,
    used_at     BIGINT
);
CREATE INDEX approvals_room ON approvals(room_id);
