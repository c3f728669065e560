-- Version 15: each relay reports, with its heartbeat, whether its route
-- waits for a rate limit and whether its messages fail (see
-- docs/operations.md, "Route health").
-- relay-min: 9 (relays of versions 9 to 14 run unchanged on it: they
-- register without the new columns, which then stay NULL and say the
-- route is neither limited nor failing, and never read them)
--
-- limited_since is when the route started waiting for its rate limit or
-- for its destination (a Retry-After), NULL when it did not wait within
-- the last heartbeat interval; limited_cause says what it waits for.
-- failing_since is the first failure (an attempt counted: retried or
-- dead-lettered) of the route's current streak of failing messages,
-- NULL once a heartbeat interval delivered without one; last_error is
-- the latest failure (redacted by the sink, at most 500 characters).
-- `outbox-relay status` and the console show them.
ALTER TABLE {{.Schema}}.relays
    ADD COLUMN limited_since timestamptz,
    ADD COLUMN limited_cause text,
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN last_error text;
