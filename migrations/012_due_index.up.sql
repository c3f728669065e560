-- Version 12: an index of the rows that wait for a time.
-- relay-min: 9
--
-- A retry and a delayed message are rows with available_at set. The
-- schema's watcher (one relay process per schema) looks up the rows that
-- came due since its last look, and the next time one will, so that it
-- wakes the workers of their lanes when they are due instead of leaving
-- them to the workers' safety poll. By this index both are one index
-- range or probe however many messages wait (a million deliveries
-- scheduled for tomorrow included). Writers pay for it only for rows
-- they write with available_at set (delayed messages).
--
-- Building it reads the whole table under a lock that blocks writers; on a
-- large outbox, create the two indexes CONCURRENTLY by hand first (same
-- names and definitions), and this migration leaves them alone.
CREATE INDEX IF NOT EXISTS messages_due_idx ON {{.Schema}}.messages (available_at)
    WHERE available_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS deliveries_due_idx ON {{.Schema}}.deliveries (available_at)
    WHERE available_at IS NOT NULL;
