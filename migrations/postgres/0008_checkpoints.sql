-- A room's named checkpoints: its document and its workspace at one moment, in files under
-- DATA_DIR/rooms/<room>/checkpoints/<id>/ (doc.bin: the document as one Yjs update;
-- workspace.tar: the workspace archive). Removed with the room.
CREATE TABLE checkpoints (
    id      TEXT PRIMARY KEY,
    room_id TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    name    TEXT NOT NULL,
    author  TEXT NOT NULL,
    at      BIGINT NOT NULL,
    bytes   BIGINT NOT NULL,
    -- Made by the room's schedule (1) or by someone (0): each kind is kept to its own count.
    scheduled BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX checkpoints_room ON checkpoints (room_id, at);

-- A fork's parentage (JSON: {"room", "checkpoint", "chain_head", "dropped"}); NULL for a room
-- made from scratch.
ALTER TABLE rooms ADD COLUMN parent TEXT;

-- The room's readiness command (run in its sandbox after every start or resume), if any.
ALTER TABLE rooms ADD COLUMN readiness TEXT;

-- The room's checkpoint policy: one every N ms (NULL: none) and when the next is due; the age
-- past which checkpoints are pruned (NULL: by count only).
ALTER TABLE rooms ADD COLUMN checkpoint_every_ms BIGINT;
ALTER TABLE rooms ADD COLUMN checkpoint_due_at BIGINT;
ALTER TABLE rooms ADD COLUMN checkpoint_keep_ms BIGINT;
-- Whether restoring a checkpoint needs an approval by someone else (1) or not (0).
ALTER TABLE rooms ADD COLUMN checkpoint_restore_approval BIGINT NOT NULL DEFAULT 0;
