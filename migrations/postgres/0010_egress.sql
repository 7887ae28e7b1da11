-- The room's egress policy (JSON: {"allow": [rules], "presets": [names]}): what its sandbox may
-- reach through the egress proxy. '{}' reaches nothing; only an audited change alters it.
ALTER TABLE rooms ADD COLUMN egress TEXT NOT NULL DEFAULT '{}';
