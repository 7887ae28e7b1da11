-- Which server owns a loaded room (issue 18): one row per room while some server holds it. The
-- owner renews expires_at (Unix ms, the database's clock); another server takes the row only
-- once it has expired, and every takeover raises the fencing token. Every append to the room's
-- update log names the token it was loaded under, and the database refuses one that is not the
-- current token in the same statement.
CREATE TABLE room_leases (
    room_id     TEXT PRIMARY KEY REFERENCES rooms(id) ON DELETE CASCADE,
    owner       TEXT NOT NULL,
    address     TEXT NOT NULL,
    token       INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
