-- Users, bearer sessions, rooms, participants and the per-room Yjs update log.
-- Times are Unix milliseconds. IDs are opaque text.
CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    email       TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE sessions (
    token_hash  TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX sessions_user ON sessions(user_id);

CREATE TABLE rooms (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_by  TEXT NOT NULL REFERENCES users(id),
    created_at  BIGINT NOT NULL
);

CREATE TABLE participants (
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    user_id     TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (room_id, user_id)
);
CREATE INDEX participants_user ON participants(user_id);

-- Every Yjs update (v1 encoding) a room accepted, in order, until compaction folds it into
-- the snapshot. seq is assigned by the room's single owner task.
CREATE TABLE doc_updates (
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (room_id, seq)
);

-- The room's document as one update that covers every log entry with seq <= upto_seq.
CREATE TABLE doc_snapshots (
    room_id     TEXT PRIMARY KEY REFERENCES rooms(id) ON DELETE CASCADE,
    upto_seq    BIGINT NOT NULL,
    data        BYTEA NOT NULL,
    updated_at  BIGINT NOT NULL
);
