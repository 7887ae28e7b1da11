-- Requests a preview has answered (written in batches by the preview origin).
ALTER TABLE previews ADD COLUMN hits INTEGER NOT NULL DEFAULT 0;
