package testkit

import (
	"os/exec"
	"strings"
	"testing"
)

// OnlyImports fails t for each package outside the standard library that
// the package in the test's directory depends on, directly or through
// another package, unless its import path is one of allowed or starts
// with one of them (a prefix ending in "/" admits a whole tree). It keeps
// a package doc's "imports only …" true.
func OnlyImports(t testing.TB, allowed ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		ok := false
		for _, a := range allowed {
			if p == a || strings.HasPrefix(p, a) {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("the package imports %s (directly or through another package)", p)
		}
	}
}
