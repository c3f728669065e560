package cli

import "testing"

func TestGCSettings(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	none := func() int64 { return 0 }
	p, l, ok := gcSettings(env(nil), none)
	if !ok || p != 400 || l != 256<<20 {
		t.Errorf("no environment, no cgroup: %d %d %v", p, l, ok)
	}
	_, l, _ = gcSettings(env(nil), func() int64 { return 256 << 20 })
	if l != 192<<20 {
		t.Errorf("cgroup limit 256 MiB: soft limit %d, want 192 MiB", l)
	}
	for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
		if _, _, ok := gcSettings(env(map[string]string{k: "100"}), none); ok {
			t.Errorf("%s set: the relay must leave the collector alone", k)
		}
	}
}

func TestParseCgroupLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"max\n":                 0,
		"268435456\n":           268435456,
		"9223372036854771712\n": 0, // cgroup v1's "no limit"
		"":                      0,
		"garbage":               0,
	} {
		if got := parseCgroupLimit(in); got != want {
			t.Errorf("parseCgroupLimit(%q) = %d, want %d", in, got, want)
		}
	}
}
