-- Which server is carrying out a confirmed deletion (issue 18), until when: a claim it renews
-- after every step. Another server picks up a deletion whose claim has lapsed (its runner died
-- part way), and never runs one whose claim is live.
ALTER TABLE deletions ADD COLUMN runner TEXT;
ALTER TABLE deletions ADD COLUMN runner_until BIGINT;
