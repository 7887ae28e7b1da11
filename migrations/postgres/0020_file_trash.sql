-- Files deleted from a room's document (issue 41): what each held (its text as UTF-8 bytes: a
-- text may hold NUL, which PostgreSQL's TEXT refuses), its size, who deleted it and when, so
-- it can be restored for a while. The room keeps its newest 100 (the oldest go first), and the
-- rows go with the room.
CREATE TABLE file_trash (
    id          TEXT PRIMARY KEY,
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    path        TEXT NOT NULL,
    content     BYTEA NOT NULL,
    bytes       BIGINT NOT NULL,
    deleted_by  TEXT NOT NULL,
    deleted_at  BIGINT NOT NULL
);
CREATE INDEX file_trash_room ON file_trash (room_id, deleted_at);
