-- The name a person chooses to be shown by (issue 41): NULL until they choose one, and then
-- shown instead of their email in rooms (presence, people, the audit log in words).
ALTER TABLE users ADD COLUMN display_name TEXT;
