-- Version 13: each relay registers what its route's configuration is.
-- relay-min: 9 (relays of versions 9 to 12 run unchanged on it: they
-- register without the new columns, which then hold '' (a configuration
-- not known), and never read them)
--
-- config_hash is a fingerprint of what decides where and how a route's
-- messages go: the route's topic patterns, its sink's kind and target,
-- the payload format, the dead-letter policy and the fan-out
-- destinations. config_summary says the same for operators, in a line,
-- with every secret redacted. A relay that finds live relays of its route
-- registered with another fingerprint takes none of their lanes (see
-- relay/confcheck.go): relays that disagree on a route never share its
-- lanes unnoticed. Both columns are set at registration; an empty hash is
-- a relay of an older version, whose configuration is not known.
ALTER TABLE {{.Schema}}.relays
    ADD COLUMN config_hash text NOT NULL DEFAULT '',
    ADD COLUMN config_summary text NOT NULL DEFAULT '';
