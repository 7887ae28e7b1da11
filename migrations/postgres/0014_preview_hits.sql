-- Requests a preview has answered (written in batches by the preview origin).
ALTER TABLE previews ADD COLUMN hits BIGINT NOT NULL DEFAULT 0;
