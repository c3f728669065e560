package redact_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/internal/redact/redacttest"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		// Well-formed: only the password goes.
		{"postgres://u:pw@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgres://u@h/db?PASSWORD=pw&sslmode=disable", "postgres://u@h/db?PASSWORD=xxxxx&sslmode=disable"},
		{"postgres://u@h/db?sslpassword=pw", "postgres://u@h/db?sslpassword=xxxxx"},
		{"postgres://u@h/db?p%61ssword=pw", "postgres://u@h/db?p%61ssword=xxxxx"},
		{"postgres://u@h/db?password%3Dpw", "postgres://u@h/db?xxxxx"},
		{"postgres://u@h/db?a=password=pw", "postgres://u@h/db?a=password=xxxxx"},
		{"postgres://u@h/db?application_name=a@b", "postgres://u@h/db?application_name=a@b"},
		{"kafka://u:pw@h1:9092,h2:9092?tls=true", "kafka://u:xxxxx@h1:9092,h2:9092?tls=true"},
		{"https://h.example.com/x?secret=whsec_abc&timeout=5s", "https://h.example.com/x?secret=xxxxx&timeout=5s"},
		{"https://h.example.com/x?access_token=t&key=k&sig=s", "https://h.example.com/x?access_token=xxxxx&key=xxxxx&sig=xxxxx"},
		{"postgres://u:pw@h:99999/db", "postgres://u:xxxxx@h:99999/db"},
		// Malformed: everything that may be userinfo goes.
		{"postgres//u:pw@h/db", "postgres//xxxxx@h/db"},
		{"postgres:/u:pw@h/db", "postgres:/xxxxx@h/db"},
		{"postgres:u:pw@h/db", "xxxxx@h/db"},
		{"u:pw@h/db", "xxxxx@h/db"},
		{"https//u:pw@h/x", "https//xxxxx@h/x"},
		{"postgres://u:p@ss@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:pw%zz@h/db", "postgres://xxxxx@h/db"},
		{"postgres://u:12#34@h/db", "postgres://xxxxx@h/db"},
		{"kafka://h:1/u:pw@x", "kafka://xxxxx@x"},
		{"postgres//u@h/db?PassWord=pw", "postgres//xxxxx@h/db?PassWord=xxxxx"},
		// Key/value.
		{"host=h user=u password=pw dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"host=h PASSWORD = 'p w' dbname=d", "host=h PASSWORD = xxxxx dbname=d"},
		{`host=h password=p\ w dbname=d`, "host=h password=xxxxx dbname=d"},
		{"host=h password='unterminated dbname=d", "host=h password=xxxxx"},
		{"host=h user=me@corp sslpassword=pw", "host=h user=me@corp sslpassword=xxxxx"},
		{"host=h options=password=pw", "host=h options=password=xxxxx"},
		{"host=h u:pw@x", "host=h xxxxx@x"},
		// Nothing to hide.
		{"", ""},
		{"stdout", "stdout"},
		{"discard://", "discard://"},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := redact.URL(redact.URL(tc.in)); got != redact.URL(tc.in) {
			t.Errorf("URL is not idempotent on %q: %q", tc.in, got)
		}
	}
}

// FuzzURL builds strings around a password from fuzzed pieces, in the
// places a password goes: URL userinfo, or the value of a credential-like
// parameter (any case, query or key/value form), well-formed or not. The
// redacted text must not depend on the password: the same pieces around
// another password give the same text. Both passwords are letters and
// digits starting with a non-hex letter, so they parse alike wherever they
// land.
func FuzzURL(f *testing.F) {
	for _, s := range redacttest.Seeds {
		f.Add(s.Form, s.Pre, s.User, s.Post)
	}
	f.Fuzz(func(t *testing.T, form uint8, pre, user, post string) {
		in := redacttest.Input{Form: form, Pre: pre, User: user, Post: post}
		a, b := redact.URL(in.Build(redacttest.PasswordA)), redact.URL(in.Build(redacttest.PasswordB))
		if a != b {
			t.Fatalf("the password shows through for %q: %q (with another password %q)", in.Build(redacttest.PasswordA), a, b)
		}
		if strings.Contains(in.Build(redacttest.PasswordB), redacttest.PasswordA) {
			return // the pieces hold the password themselves
		}
		if strings.Contains(a, redacttest.PasswordA) {
			t.Fatalf("URL(%q) = %q", in.Build(redacttest.PasswordA), a)
		}
	})
}
