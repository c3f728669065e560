-- When a key's row was last touched (inserted, or its mark checked and
-- advanced by a new message), so that Prune can remove the marks of keys
-- idle for longer than PruneConfig.KeyWindow. now() is not volatile: the
-- default is evaluated once, here, and kept in the catalog, so existing
-- rows are not rewritten and count as touched at the upgrade. The column
-- has no index: the statement that advances a mark also sets it, and an
-- unindexed column keeps that update HOT (no index entry per message).
-- Prune walks the primary key instead.
ALTER TABLE {{.Schema}}.inbox_keys ADD COLUMN touched_at timestamptz NOT NULL DEFAULT now();
