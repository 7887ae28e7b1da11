-- Whether adding a secret to the room needs an approval by someone else who holds approve
-- (1) or not (0): PUT /api/rooms/{id}/secrets-policy.
ALTER TABLE rooms ADD COLUMN secrets_need_approval INTEGER NOT NULL DEFAULT 0;
