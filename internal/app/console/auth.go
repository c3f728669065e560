package console

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// MinTokenLength is the shortest token a token file may hold.
const MinTokenLength = 16

// Tokens are the named bearer tokens of the console.
type Tokens struct {
	list []token
}

type token struct {
	name     string
	readOnly bool
	sum      [sha256.Size]byte
}

// ParseTokens reads a token file: one token a line, as name:token, or
// name:token:read for a token that may only read. Blank lines and lines
// starting with # are ignored. Names are unique; tokens are at least
// MinTokenLength bytes and unique.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "read") {
			return nil, fmt.Errorf("line %d: want name:token or name:token:read", n)
		}
		name, secret := parts[0], parts[1]
		switch {
		case name == "" || strings.ContainsAny(name, " \t"):
			return nil, fmt.Errorf("line %d: the token's name is empty or has spaces", n)
		case names[name]:
			return nil, fmt.Errorf("line %d: name %q is used twice", n, name)
		case len(secret) < MinTokenLength:
			return nil, fmt.Errorf("line %d: token %q is shorter than %d characters (openssl rand -hex 32 makes a good one)", n, name, MinTokenLength)
		}
		sum := sha256.Sum256([]byte(secret))
		if sums[sum] {
			return nil, fmt.Errorf("line %d: token %q is the same as an earlier one", n, name)
		}
		names[name], sums[sum] = true, true
		t.list = append(t.list, token{name: name, readOnly: len(parts) == 3, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.list) == 0 {
		return nil, fmt.Errorf("no token in the file (one name:token a line)")
	}
	return t, nil
}

// check returns the token matching secret. Every token is compared, in
// constant time, whether or not an earlier one matched: the time taken
// says nothing about which token, or how much of one, was right.
func (t *Tokens) check(secret string) (token, bool) {
	sum := sha256.Sum256([]byte(secret))
	var found token
	ok := 0
	for _, tk := range t.list {
		eq := subtle.ConstantTimeCompare(sum[:], tk.sum[:])
		if eq == 1 {
			found = tk
		}
		ok |= eq
	}
	return found, ok == 1
}

// presented returns the token a request carries: a bearer token, or the
// password of Basic authentication (for a browser reading protected
// pages: it sends no bearer token by itself).
func presented(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:]), true
	}
	if _, pw, ok := r.BasicAuth(); ok {
		return pw, true
	}
	return "", false
}

const (
	msgNoTokens = "mutations are disabled: start the relay with --admin-token-file FILE (one name:token a line) to enable them"
	msgNoAuth   = "this needs a token: send Authorization: Bearer <token> (a token of --admin-token-file)"
	msgBadToken = "the token is not one of --admin-token-file's"
	msgReadOnly = "token %q may only read (it is marked :read in --admin-token-file)"
	// The dead letters' answers without a token.
	msgPayloadsNoTokens = "dead letters carry message payloads and headers, which need a token: start the relay with --admin-token-file FILE " +
		"(one name:token a line; name:token:read for one that may only read) and send one (Authorization: Bearer <token>; a browser asks for it), " +
		"or serve them to anyone who reaches the admin listener with --admin-open-payloads (OUTBOX_ADMIN_OPEN_PAYLOADS)"
	msgPayloadsNoAuth = "dead letters carry message payloads and headers, which need a token: send Authorization: Bearer <token> (a token of --admin-token-file; a read-only one will do)"
)

// read wraps a handler that only reads and shows no message's payload or
// headers: with ProtectReads it needs a token, read-only or not.
func (c *Console) read(h http.Handler) http.Handler {
	if !c.cfg.ProtectReads {
		return h
	}
	return c.token(h, msgNoAuth)
}

// payloads wraps a read that returns messages' payloads or headers: it
// needs a token, read-only or not, unless OpenPayloads; without tokens it
// is refused with 403, saying what to set.
func (c *Console) payloads(h http.Handler) http.Handler {
	switch {
	case c.cfg.OpenPayloads:
		return c.read(h)
	case c.cfg.Tokens == nil:
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.fail(w, r, http.StatusForbidden, msgPayloadsNoTokens)
		})
	}
	return c.token(h, msgPayloadsNoAuth)
}

// token wraps h so that it needs a token of Tokens, read-only or not;
// noAuth is the answer to a request that sends none.
func (c *Console) token(h http.Handler, noAuth string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := presented(r)
		if !ok {
			c.challenge(w, r, noAuth)
			return
		}
		if _, ok := c.cfg.Tokens.check(secret); !ok {
			c.challenge(w, r, msgBadToken)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// challenge answers 401; the UI's challenge is Basic, so that a browser
// asks for the token (as the password; the user name is ignored).
func (c *Console) challenge(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasPrefix(r.URL.Path, "/ui") {
		w.Header().Set("WWW-Authenticate", `Basic realm="outbox-relay console (password: a token of --admin-token-file)", charset="UTF-8"`)
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-relay"`)
	}
	c.fail(w, r, http.StatusUnauthorized, msg)
}

// authorize checks that a mutation's token may write and returns its
// name; it has answered the request when ok is false. A token missing or
// wrong is a 401 with a Bearer challenge for the API, and a 403 for the
// UI's forms (a Basic challenge there would make the browser ask for a
// password the form does not read).
func (c *Console) authorize(w http.ResponseWriter, r *http.Request, secret string, given bool) (name string, ok bool) {
	if c.cfg.Tokens == nil {
		c.fail(w, r, http.StatusForbidden, msgNoTokens)
		return "", false
	}
	refuse := func(msg string) {
		if strings.HasPrefix(r.URL.Path, "/ui") {
			if msg == msgNoAuth {
				msg = "enter a token: the token part of a name:token line of --admin-token-file"
			}
			c.fail(w, r, http.StatusForbidden, msg)
			return
		}
		c.challenge(w, r, msg)
	}
	if !given || secret == "" {
		refuse(msgNoAuth)
		return "", false
	}
	tk, found := c.cfg.Tokens.check(secret)
	if !found {
		refuse(msgBadToken)
		return "", false
	}
	if tk.readOnly {
		c.fail(w, r, http.StatusForbidden, fmt.Sprintf(msgReadOnly, tk.name))
		return "", false
	}
	return tk.name, true
}

// write wraps an API mutation: origin checked, body bounded, token
// checked. The handler gets the token's name for the audit log.
func (c *Console) write(h func(w http.ResponseWriter, r *http.Request, who string)) http.Handler {
	return c.cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, given := "", false
		if hd := r.Header.Get("Authorization"); len(hd) > 7 && strings.EqualFold(hd[:7], "bearer ") {
			secret, given = strings.TrimSpace(hd[7:]), true
		}
		who, ok := c.authorize(w, r, secret, given)
		if !ok {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		h(w, r, who)
	}))
}
