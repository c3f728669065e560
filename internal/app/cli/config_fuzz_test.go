package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
)

// FuzzConfigFile feeds arbitrary YAML to the config-file loader through the
// real command line (`migrate --print --config FILE`, which needs no
// database): it must never panic, and must either succeed (exit 0, the
// migration SQL on stdout) or refuse the file as invalid configuration
// (exit 2, an error on stderr). Exit 1 would mean an invalid file is
// reported as a runtime failure. It then runs `run` with the same file and
// a database URL that does not parse, which decodes the sink sections and
// routes: whatever the file holds, that is exit 2 before any connection.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"",
		"schema: app\n",
		"schema: 'we\"ird''; DROP TABLE x; --'\nlog-level: debug\nlog-format: json\n",
		"database-url: postgres://relay:hunter2@db:5432/app\nsink: stdout\nworkers: 4\nbatch-size: 100\n",
		"workers: [1, 2]\n",
		"poll-interval: 1s\nmax-attempts: 12\nretry-jitter: 0.5\n",
		"http:\n  secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]\n  routes:\n    - {topic: \"billing.*\", url: \"https://b.example.com/hook\"}\n",
		"kafka: {brokers: [a:9092], tls: {enable: true}}\n",
		"amqp:\n  exchange: events\n",
		"- a\n- b\n",
		"unknown: 1\n",
		"schema: {a: b}\n",
		"schema: ''\n",
		": :\n",
		"a: &x [*x]\n",
		"schema: !!binary aGVsbG8=\n",
		"log-level: 7\n",
		"%YAML 1.2\n---\nschema: x\n",
		"schema: x\n---\nschema: y\n",
		"\xff\xfe",
		"schema: \"\\0\"\n",
		"schema: " + strings.Repeat("s", 60) + "\n",
		"? [a, b]\n: c\n",
		"<<: {schema: merged}\n",
		"schema: ~\n",
		"config: other.yaml\n",
		"schema: a\nschema: b\n",
		"batch-size: 1\nbatch_size: 2\n",
		"sink: kafka://h:1\nkafka: {client_id: a, client_id: b}\n",
		"sink: kafka://h:1\nhttp: {timeout: 5s}\n",
		"sink: kafka://h:1\nkafka: &x {tls: *x}\n",
		"sink: kafka://h:1\nkafka: &x {brokers: *x, sasl: {password: [x]}}\n",
		"sink: https://h.example.com/x\nhttp: {routes: [{topic: a, url: 5, colour: x}], <<: {timeout: 1s}}\n",
		"routes:\n  - {name: a, topics: [x], sink: stdout, amqp: {exchange: e}}\n",
		"http: {timeout: 5s}\nroutes:\n  - {name: a, topics: [x], sink: stdout}\n",
		"routes: &r\n  - {name: a, topics: [x], sink: stdout, kafka: *r}\n",
		"schema: x\n---\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		path := filepath.Join(t.TempDir(), "relay.yaml")
		if err := os.WriteFile(path, doc, 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := cli.Main([]string{"migrate", "--print", "--config", path}, &stdout, &stderr)
		switch code {
		case 0:
			if !strings.Contains(stdout.String(), "BEGIN;") {
				t.Fatalf("exit 0 without the migration script; stdout %q", stdout.String())
			}
		case 2:
			if !strings.HasPrefix(stderr.String(), "outbox-relay: ") {
				t.Fatalf("exit 2 without an error message; stderr %q", stderr.String())
			}
		default:
			t.Fatalf("exit %d for config %q; stderr %q", code, doc, stderr.String())
		}
		stdout.Reset()
		stderr.Reset()
		code = cli.Main([]string{"run", "--config", path, "--database-url", "postgres://x@127.0.0.1:1/d?sslmode=bogus"}, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "outbox-relay: ") {
			t.Fatalf("run: exit %d for config %q; stderr %q", code, doc, stderr.String())
		}
	})
}
