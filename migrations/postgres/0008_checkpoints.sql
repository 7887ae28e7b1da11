-- A room's named checkpoints: its document and its workspace at one moment, in files under
-- DATA_DIR/rooms/<room>/checkpoints/<id>/ (doc.bin: the document as one Yjs update;
-- workspace.tar: the workspace archive). Removed with the room.
CREATE TABLE checkpoints (
    id      TEXT PRIMARY KEY,
    room_id TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    name    TEXT NOT NULL,
    author  TEXT NOT NULL,
    at      BIGINT NOT NULL,
    bytes   BIGINT NOT NULL
);
CREATE INDEX checkpoints_room ON checkpoints (room_id, at);

-- A fork's parentage (JSON: {"room", "checkpoint", "chain_head", "dropped"}); NULL for a room
-- made from scratch.
ALTER TABLE rooms ADD COLUMN parent TEXT;

-- The room's readiness command (run in its sandbox after every start or resume), if any.
ALTER TABLE rooms ADD COLUMN readiness TEXT;
