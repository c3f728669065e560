package chaos

import (
	"strings"
	"testing"
)

// TestVerify feeds the checker hand-made receiver logs, one per kind of
// contract breach, so that a green chaos run means the breaches were
// looked for.
func TestVerify(t *testing.T) {
	t.Parallel()
	committed := map[string]committedMsg{
		"a1": {"a", 1}, "a2": {"a", 2}, "a3": {"a", 3},
		"b1": {"b", 1},
	}
	d := func(id, key string, seq int, tag string) delivery {
		return delivery{id: id, key: key, payload: payload{Key: key, Seq: seq, Tag: tag}}
	}
	good := []delivery{
		d("ia1", "a", 1, "a1"), d("ib1", "b", 1, "b1"), d("ia2", "a", 2, "a2"),
		d("ia1", "a", 1, "a1"), // a re-delivery after a later message: allowed
		d("ia3", "a", 3, "a3"), d("ia3", "a", 3, "a3"),
	}
	v := verify(committed, nil, good)
	if len(v.violations) != 0 || v.unique != 4 || v.duplicates != 2 || v.deliveries != 6 {
		t.Fatalf("clean log: got %+v", v)
	}
	for _, tc := range []struct {
		name string
		log  []delivery
		want string
	}{
		{"lost", good[:3], "committed message never delivered: key a seq 3 (tag a3)"},
		{"order", []delivery{d("ia1", "a", 1, "a1"), d("ia3", "a", 3, "a3"), d("ia2", "a", 2, "a2"), d("ib1", "b", 1, "b1")},
			"per-key order broken: delivery #1: key a seq 3 (tag a3) delivered first, before seq 2 (tag a2)"},
		{"rolled back", append(good, d("x", "a", 4, "rb")), "rolled-back message delivered"},
		{"unknown", append(good, d("y", "a", 4, "zz")), "uncommitted message delivered"},
		{"unstable id", append(good, d("other", "b", 1, "b1")), "unstable message id"},
		{"reused id", append(good[:5:5], d("ia1", "a", 3, "a3")), "message id reused"},
		{"content", append(good, d("ib1", "b", 2, "b1")), "content mismatch"},
	} {
		v := verify(committed, map[string]bool{"rb": true}, tc.log)
		if !strings.Contains(strings.Join(v.violations, "\n"), tc.want) {
			t.Errorf("%s: violations %q, want one containing %q", tc.name, v.violations, tc.want)
		}
	}
}
