-- When a participant was removed from a room: invite links made before that moment no longer
-- let them back in.
CREATE TABLE removals (
    room_id     TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    user_id     TEXT NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (room_id, user_id)
);
