-- Invites with their capabilities chosen, and invites sent to one address (issue 41): an invite
-- may hold a chosen set of capabilities (comma-separated names; NULL: its role's), and may be
-- for one email address (NULL: for whoever has the link). Only that account accepts it.
ALTER TABLE invites ADD COLUMN capabilities TEXT;
ALTER TABLE invites ADD COLUMN email TEXT;
