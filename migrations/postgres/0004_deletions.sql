-- Room deletions: requested by an owner, confirmed by a system admin, carried out step by step
-- with each step's result recorded in the same transaction as the step (so a rerun after a
-- crash skips what is done and the receipt stays complete).
CREATE TABLE deletions (
    id            TEXT PRIMARY KEY,
    room_id       TEXT NOT NULL,
    requested_by  TEXT NOT NULL,
    requested_at  BIGINT NOT NULL,
    state         TEXT NOT NULL,
    confirmed_by  TEXT,
    confirmed_at  BIGINT,
    receipt       TEXT,
    receipt_hash  TEXT
);
CREATE INDEX deletions_room ON deletions(room_id);

CREATE TABLE deletion_steps (
    deletion_id   TEXT NOT NULL,
    artifact      TEXT NOT NULL,
    status        TEXT NOT NULL,
    count         BIGINT NOT NULL,
    at            BIGINT NOT NULL,
    PRIMARY KEY (deletion_id, artifact)
);
