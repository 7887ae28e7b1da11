-- A deletion keeps the room's name, for the admin console's list once the room is gone.
ALTER TABLE deletions ADD COLUMN room_name TEXT;
