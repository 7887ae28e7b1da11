-- Spend: each participant's use of each meter in a room, the running sums of the room's
-- `metered` audit records (written in the same transaction as each record), and the room's
-- budget (JSON limits per meter; NULL: none). Agents' budgets are in agents.budget.
CREATE TABLE spend (
    room_id TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    who     TEXT NOT NULL,
    meter   TEXT NOT NULL,
    amount  INTEGER NOT NULL,
    PRIMARY KEY (room_id, who, meter)
);
ALTER TABLE rooms ADD COLUMN budget TEXT;
-- Moderated rooms: 1 when agents may type in the shared terminal only while a person who holds
-- approve is in the room.
ALTER TABLE rooms ADD COLUMN moderated INTEGER NOT NULL DEFAULT 0;
