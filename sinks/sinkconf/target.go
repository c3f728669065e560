package sinkconf

import (
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// Routing marks p as a parameter that decides where a message goes or the
// form it arrives in (an exchange, a routing key, a stream, a topic map, a
// content type): relays of one route that disagree on it deliver the
// route's messages to different places, so Params.Target covers it.
// Unmarked parameters are tuning (timeouts, concurrency, batching, rates,
// reconnects), credentials, the client's name, TLS or safety checks:
// relays may differ in them and still deliver every message alike.
func Routing[C any](p Param[C]) Param[C] {
	p.routing = true
	return p
}

// Target returns the identity of c's destination: base (the sink's URL
// without its query, or any URL naming where it delivers) reduced by
// TargetURL, then c's Routing parameters that are set, sorted by name.
// Relays compare targets through a hash (the relay's configuration
// fingerprint); a target is not for logs, since a webhook's path may hold
// its token.
func (p Params[C]) Target(c *C, base string) string {
	q := url.Values{}
	for _, pr := range p.params {
		if !pr.routing || redact.Sensitive(pr.name) {
			continue
		}
		for _, v := range pr.get(c) {
			q.Add(pr.name, v)
		}
	}
	t := TargetURL(base)
	if len(q) > 0 {
		// A space never occurs in either part (both are escaped): the
		// parameters cannot be mistaken for the URL's own query.
		t += " " + q.Encode()
	}
	return t
}

// TargetURL reduces raw, a URL, to what names a destination: its scheme
// and host (in lower case), its path ("/" and "" alike), and the
// parameters of its own query (a webhook's), sorted, except those whose
// name is a credential's (redact.Sensitive). The userinfo (the account,
// not the destination) and the fragment go. A value that does not parse
// as a URL is returned redacted, as it is: still a stable identity.
func TargetURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redact.URL(raw)
	}
	out := url.URL{Scheme: strings.ToLower(u.Scheme), Host: strings.ToLower(u.Host), Opaque: u.Opaque}
	if p := u.EscapedPath(); p != "/" {
		out.RawPath = p
		out.Path = u.Path
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			// A query no parser agrees on: kept whole but redacted.
			out.RawQuery = redact.URL(u.RawQuery)
			return out.String()
		}
		for name := range q {
			if redact.Sensitive(name) {
				delete(q, name)
			}
		}
		out.RawQuery = q.Encode()
	}
	return out.String()
}
