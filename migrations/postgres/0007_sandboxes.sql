-- One row per room that ever had a sandbox: its lifecycle state, the latest workspace snapshot
-- (a file under DATA_DIR/rooms/<room>/workspace/), and the durable idle timer.
CREATE TABLE sandboxes (
    room_id     TEXT PRIMARY KEY REFERENCES rooms(id) ON DELETE CASCADE,
    state       TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    receipt     TEXT NOT NULL DEFAULT '{}',
    snapshot    TEXT,
    snapshot_at BIGINT,
    stop_at     BIGINT,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX sandboxes_stop_at ON sandboxes (stop_at);
