package cli

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/redact/redacttest"
)

// FuzzSecretsNotPrinted builds database and sink URLs around a password
// from fuzzed pieces: in userinfo, or as the value of a password-like
// parameter (any case, key/value or query form), well-formed or not. It
// checks every text the CLI shows for such a URL (the redacted form in log
// lines, the database URL's parse error, the sink's parse or validation
// error or its redacted name) and requires that the text does not depend on
// the password: the same pieces around another password give the same
// text. Both passwords are letters and digits starting with a non-hex
// letter, so they parse alike wherever they land (see redacttest).
func FuzzSecretsNotPrinted(f *testing.F) {
	for _, s := range redacttest.Seeds {
		f.Add(s.Form, s.Pre, s.User, s.Post)
	}
	g := &globals{log: slog.New(slog.NewTextHandler(io.Discard, nil)), file: &fileConfig{}}
	f.Fuzz(func(t *testing.T, form uint8, pre, user, post string) {
		build := redacttest.Input{Form: form, Pre: pre, User: user, Post: post}.Build
		shown := func(raw string) string {
			var b strings.Builder
			b.WriteString(redactURL(raw))
			b.WriteString("\n")
			gg := *g
			gg.databaseURL = raw
			if err := gg.requireDatabase(); err != nil {
				b.WriteString(err.Error())
			}
			b.WriteString("\n")
			if _, name, err := parseSinkWith(raw, "--sink", &gg, nil); err != nil {
				b.WriteString(err.Error())
			} else {
				b.WriteString(name)
			}
			return b.String()
		}
		a, b := shown(build(redacttest.PasswordA)), shown(build(redacttest.PasswordB))
		if a != b {
			t.Fatalf("the password shows through for %q:\n%s\n---- with another password:\n%s", build(redacttest.PasswordA), a, b)
		}
	})
}
