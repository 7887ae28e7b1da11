-- Requests that need another participant's approval, bound to their exact parameters.
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    requester   TEXT NOT NULL,
    action      TEXT NOT NULL,
    params      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    decided_by  TEXT,
    decided_at  INTEGER,
    approved    INTEGER,
    used_at     INTEGER
);
CREATE INDEX approvals_room ON approvals(room_id);
