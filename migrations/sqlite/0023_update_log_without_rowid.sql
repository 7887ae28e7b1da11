-- The update log as one b-tree keyed by (room_id, seq) (issue 40): a rowid table with that
-- primary key keeps two, the rows and the key's index, so every append wrote two pages to the
-- WAL before its fsync; without a rowid it writes one (13-22% less time and CPU per commit,
-- measured on this project's machine: docs/benchmarks.md). Rows are pruned after each
-- compaction, so the copy is small.
CREATE TABLE doc_updates_keyed (
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (room_id, seq)
) WITHOUT ROWID;
INSERT INTO doc_updates_keyed (room_id, seq, data) SELECT room_id, seq, data FROM doc_updates;
DROP TABLE doc_updates;
ALTER TABLE doc_updates_keyed RENAME TO doc_updates;
