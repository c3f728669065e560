-- Version 4: each relay reports, with its heartbeat, how many claimed
-- messages it is publishing right now (shown by `outbox-relay status`).
ALTER TABLE {{.Schema}}.relays ADD COLUMN in_flight integer NOT NULL DEFAULT 0;
