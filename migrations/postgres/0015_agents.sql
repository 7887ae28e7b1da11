-- Agents: participants sponsored by a person, bound to one room. Each is a user of its own
-- (email agent-<id>@agents.invalid, never able to log in) whose token is a session. It holds
-- what it was given (capabilities, JSON names) and, at every moment, no more than its sponsor;
-- it ends with its sponsor's removal, its expiry or its revocation (revoked_at).
CREATE TABLE agents (
    user_id      TEXT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
    room_id      TEXT NOT NULL REFERENCES rooms(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    sponsor      TEXT NOT NULL,
    capabilities TEXT NOT NULL,
    budget       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    revoked_at   BIGINT,
    -- 1: each command it runs waits for someone's approval of exactly that command.
    approval_mode BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX agents_room ON agents (room_id);
