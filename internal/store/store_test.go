package store

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden SQL files under testdata/")

// golden compares a rendered statement with testdata/<name>.sql; with
// -update it writes the file instead. Statements are rendered for the
// default schema.
func golden(t *testing.T, name, sql string) {
	t.Helper()
	path := filepath.Join("testdata", name+".sql")
	got := strings.TrimSpace(sql) + "\n"
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v (run go test ./internal/store -update to write it)", name, err)
	}
	if string(want) != got {
		t.Errorf("%s: rendered SQL differs from %s (go test ./internal/store -update rewrites it; review the diff)\n--- got\n%s", name, path, got)
	}
}

func testSchema(t *testing.T) Schema {
	t.Helper()
	s, err := NewSchema("")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSchemaTable(t *testing.T) {
	s := testSchema(t)
	if got := s.Table("messages"); got != `"outbox"."messages"` {
		t.Fatalf("Table = %s", got)
	}
	if _, err := NewSchema("bad\x00name"); err == nil {
		t.Fatal("a schema name with a quote was accepted")
	}
}

func TestWakerGolden(t *testing.T) {
	w := NewWaker(testSchema(t))
	golden(t, "wake_try_watch", w.tryLock.named)
	golden(t, "wake_newest_id", w.newest.named)
	golden(t, "wake_new_rows", w.newRows.named)
	golden(t, "wake_due", w.due.named)
	golden(t, "wake_notify", w.notify.named)
	golden(t, "wake_trigger_state", w.triggerState.named)
	golden(t, "wake_enable_trigger", w.trigger)
	golden(t, "wake_join", w.join.named)
	golden(t, "wake_others", w.others.named)
	golden(t, "wake_wal_state", w.walState.named)
}
