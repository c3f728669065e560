-- Version 14: each relay reports, with its heartbeat, whether its route's
-- destination is down (its outage breaker is open: see
-- docs/guarantees.md, "Sink outages cost no attempts").
-- relay-min: 9 (relays of versions 9 to 13 run unchanged on it: they
-- register without the new columns, which then say the destination is
-- not known to be down, and never read them)
--
-- down_since is when the breaker opened, NULL while the route delivers;
-- down_cause is the error that opened it or the latest probe's
-- (redacted by the sink, at most 500 characters), NULL while it
-- delivers; down_probes counts the probes that found the destination
-- still down. `outbox-relay status` and the console show them.
ALTER TABLE {{.Schema}}.relays
    ADD COLUMN down_since timestamptz,
    ADD COLUMN down_cause text,
    ADD COLUMN down_probes integer NOT NULL DEFAULT 0;
