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

// Imports returns the packages outside the standard library that pkg (a
// path go list takes: ".", "./relay/operator") imports: directly, or
// with deps also through other packages.
func Imports(t testing.TB, pkg string, deps bool) []string {
	t.Helper()
	args := []string{"list", "-f", `{{join .Imports "\n"}}`, pkg}
	if deps {
		args = []string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg}
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}
