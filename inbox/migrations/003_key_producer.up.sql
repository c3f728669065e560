-- A key's mark belongs to one producer: positions are the producing
-- outbox's row ids, so two outboxes' positions say nothing about each
-- other, and one mark per key across them made a consumer of two
-- producers refuse, for good, the messages of the one whose ids run
-- lower. The producer is named by the message (the relay's
-- outbox-producer header) or by inbox.Config.Producer; '' stands for a
-- producer that names none, and is every existing key's, so the existing
-- marks keep guarding the messages they guarded.
--
-- Adding a column with a constant default rewrites nothing; the new
-- primary key reads the key table once to build its index, under the
-- table's exclusive lock, while consumers wait. A consumer of an older
-- version fails its statement from then on (it names the old primary key
-- in ON CONFLICT): it acknowledges nothing, so nothing is lost, and it
-- works again once upgraded. The processed ids stay one set across
-- producers: a message id is a UUID.
ALTER TABLE {{.Schema}}.inbox_keys ADD COLUMN producer text NOT NULL DEFAULT '';
ALTER TABLE {{.Schema}}.inbox_keys DROP CONSTRAINT inbox_keys_pkey;
ALTER TABLE {{.Schema}}.inbox_keys ADD CONSTRAINT inbox_keys_pkey PRIMARY KEY (producer, key);
