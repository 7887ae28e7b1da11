-- Repositories connected to a room. The server keeps a bare clone of each under
-- DATA_DIR/rooms/<room>/repos/<id>.git; the credential is the room secret named here (its value
-- is sealed in secrets and never written anywhere else). base is the commit the room's files
-- were last in step with (after a connect, pull or push).
CREATE TABLE repos (
    room_id    TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    id         TEXT NOT NULL,
    url        TEXT NOT NULL,
    branch     TEXT NOT NULL,
    secret     TEXT,
    access     TEXT NOT NULL,
    path       TEXT NOT NULL,
    base       TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (room_id, id)
);
