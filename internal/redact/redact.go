// Package redact hides credentials in connection strings before they reach
// a log line or an error: the database URL (URL or key/value form) and the
// sinks' URLs, well-formed or not. It is the one place that decides what a
// secret looks like; callers pass anything a user gave as a URL through URL
// before showing it. It does not hide secrets held in typed fields (those
// have their own String methods, such as sinkconf.Secret).
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every hidden value.
const Mask = "xxxxx"

// URL returns raw with every credential replaced by Mask:
//
//   - the password of URL userinfo (user:password@host);
//   - the value of every parameter whose name looks like a credential
//     (password, sslpassword, secret, token, api_key, ...; any case,
//     percent-encoded or not), as a URL query parameter or in a key/value
//     connection string (password='a b', password=a\ b);
//   - for input that is not a well-formed URL (postgres//u:pw@h, u:pw@h,
//     an invalid port or escape, a fragment), everything before its last
//     "@": which part is the password cannot be known, so the whole of
//     what may be userinfo goes.
//
// The result keeps the rest (scheme, host, database, other options) so that
// the operator still recognizes the value. URL never fails; it errs on the
// side of hiding too much.
func URL(raw string) string {
	if wellFormed(raw) {
		// Work on the text as written (no re-encoding): the scheme, the
		// userinfo up to the last "@" of the authority, and the rest,
		// where parameters may hide in the query (or, by mistake, in the
		// path or host).
		i := strings.Index(raw, "://") + len("://")
		rest := raw[i:]
		auth := rest
		if end := strings.IndexAny(rest, "/?"); end >= 0 {
			auth = rest[:end]
		}
		info := ""
		if at := strings.LastIndex(auth, "@"); at >= 0 {
			info, rest = auth[:at+1], rest[at+1:]
			if user, _, ok := strings.Cut(auth[:at], ":"); ok {
				info = user + ":" + Mask + "@"
			}
		}
		if path, query, ok := strings.Cut(rest, "?"); ok {
			// A query value may hold an "@" (application_name=me@host);
			// one that looks like user:password@ is masked.
			pairs := strings.Split(params(query, false), "&")
			for j, p := range pairs {
				pairs[j] = userinfo(p, true)
			}
			return raw[:i] + info + params(path, false) + "?" + strings.Join(pairs, "&")
		}
		return raw[:i] + info + params(rest, false)
	}
	kv := kvForm.MatchString(raw)
	s := params(raw, kv)
	fields := strings.FieldsFunc(s, isSpace)
	if len(fields) == 0 {
		return s
	}
	// Userinfo, field by field so that a key/value string keeps its other
	// fields. Whitespace is normalized to single spaces.
	for i, f := range fields {
		fields[i] = userinfo(f, kv)
	}
	return strings.Join(fields, " ")
}

// wellFormed parses raw as a URL whose every part is where a URL parser
// (pgx's, the sinks') finds it: a scheme, "//", a host, no fragment, no
// whitespace, and no "@" outside the userinfo and the query. Anything else
// takes the textual path.
func wellFormed(raw string) bool {
	if !strings.Contains(raw, "://") || strings.ContainsFunc(raw, isSpace) || strings.Contains(raw, "#") {
		return false
	}
	u, err := url.Parse(raw)
	return err == nil && u.Scheme != "" && u.Opaque == "" && u.Host != "" && !strings.Contains(u.Path, "@")
}

// kvForm recognizes a key/value connection string (host=h user=u ...).
var kvForm = regexp.MustCompile(`^\s*[A-Za-z0-9_]+\s*=`)

// kvParam is one keyword of a key/value string and its value: single-quoted
// with backslash escapes (an unterminated quote runs to the end), or up to
// the next unescaped whitespace.
var kvParam = regexp.MustCompile(`([A-Za-z0-9_.%+-]+)(\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.?)*)`)

// params masks the value of every credential-like parameter in s, a
// key/value connection string (kv) or a query string (or anything else
// that may hold key=value pairs separated by "&").
func params(s string, kv bool) string {
	if kv {
		return kvParam.ReplaceAllStringFunc(s, func(m string) string {
			sub := kvParam.FindStringSubmatch(m)
			switch {
			case !Sensitive(sub[1]):
				return sub[1] + sub[2] + params(sub[3], true) // a=password=x
			case sub[3] == "":
				return m
			}
			return sub[1] + sub[2] + Mask
		})
	}
	pairs := strings.Split(s, "&")
	for i, p := range pairs {
		pairs[i] = pair(p)
	}
	return strings.Join(pairs, "&")
}

// pair masks one name=value pair of a query string. The value runs to the
// next "&" (";" is not a separator for Go's query parser, so a password may
// contain it). A name that is not a credential does not end the search:
// "a=password=x" is masked too.
func pair(p string) string {
	name, value, ok := strings.Cut(p, "=")
	if !ok {
		// "password%3Dx": a name holding an encoded "=".
		if dec, err := url.QueryUnescape(p); err == nil && strings.Contains(dec, "=") && Sensitive(p) {
			return Mask
		}
		return p
	}
	if !Sensitive(name) {
		return name + "=" + pair(value)
	}
	if dec, err := url.QueryUnescape(name); err == nil && strings.Contains(dec, "=") {
		name = Mask // the name itself holds an encoded "=" and a value
	}
	if value == "" {
		return name + "="
	}
	return name + "=" + Mask
}

// sensitiveWords are the parts of a parameter name that make its value a
// credential.
var sensitiveWords = []string{"pass", "pwd", "secret", "token", "apikey", "api_key", "api-key", "auth", "credential", "signature"}

// Sensitive reports whether a parameter named name (as written: any case,
// percent-encoded or not) holds a credential.
func Sensitive(name string) bool {
	names := []string{name}
	if dec, err := url.QueryUnescape(name); err == nil {
		names = append(names, dec)
	}
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "key" || n == "sig" {
			return true
		}
		for _, w := range sensitiveWords {
			if strings.Contains(n, w) {
				return true
			}
		}
	}
	return false
}

// schemePrefix is what a malformed URL shows before its userinfo:
// "postgres://", "postgres//", "postgres:/".
var schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:?/+`)

// userinfo masks whatever may be userinfo in one whitespace-free field of a
// string that is not a well-formed URL: everything between the scheme (if
// any) and the last "@". In a key/value string a field such as
// user=me@corp is left alone unless it has a ":" before the "@".
func userinfo(f string, kv bool) string {
	at := strings.LastIndex(f, "@")
	if at < 0 {
		return f
	}
	start := len(schemePrefix.FindString(f))
	if start > at {
		start = 0
	}
	info := f[start:at]
	if info == "" || info == Mask {
		return f
	}
	if kv && !strings.Contains(info, ":") {
		return f
	}
	return f[:start] + Mask + f[at:]
}

func isSpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}
