package deploytest

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
	"github.com/outbox-relay/outbox-relay/sinks/natssink"
	"github.com/outbox-relay/outbox-relay/sinks/redissink"
)

// afterDrain bounds what `outbox-relay run` does after the drain
// (internal/app/cli): closing the admin listener (5s) and the sink (10s). A
// stop grace period must cover the drain timeout plus this.
const afterDrain = 15 * time.Second

// adminPort is the port of the relay's admin listener (--admin-addr,
// default :9090): /livez, /readyz, metrics.
const adminPort = 9090

// demoTopic is the outbox topic cmd/outbox-demo writes to.
const demoTopic = "orders"

// unavailable fails the test under CI=true and skips it otherwise, like
// pgtest.Unavailable, for a tool the test needs but cannot find.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testkit.Unavailable(t, "tool", format, args...)
}

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// root returns the repository root: the directory of the go.mod above the
// test's working directory.
func root(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = fmt.Errorf("no go.mod above the working directory")
				return
			}
			dir = parent
		}
	})
	if rootErr != nil {
		t.Fatal(rootErr)
	}
	return rootDir
}

// goTool returns the go command: from PATH, else the one that built the
// test.
func goTool(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		unavailable(t, "go command not found in PATH or in GOROOT %s", runtime.GOROOT())
	}
	return p
}

func readFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeStrict decodes one YAML node into v, failing on fields v does not
// have: a misspelt key in a manifest is an error, not a silent no-op.
func decodeStrict(node *yaml.Node, v any) error {
	b, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// relaySettings are the options of one `outbox-relay run` as they reach
// the process: flags (args) over environment variables.
type relaySettings struct {
	args []string
	env  map[string]string // literal values only
}

// flag returns the value of --name in args (as --name=v or --name v), or
// else of its OUTBOX_ variable.
func (s relaySettings) flag(name string) (string, bool) {
	for i, a := range s.args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(s.args) {
			return s.args[i+1], true
		}
	}
	v, ok := s.env["OUTBOX_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]
	return v, ok
}

// drainTimeout is the relay's --drain-timeout, whose default is the
// publish timeout.
func (s relaySettings) drainTimeout(t testing.TB) time.Duration {
	t.Helper()
	name := "drain-timeout"
	v, ok := s.flag(name)
	if !ok {
		name = "publish-timeout"
		v, ok = s.flag(name)
	}
	if !ok {
		return relay.DefaultPublishTimeout
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Errorf("%s %q is not a positive duration", name, v)
		return relay.DefaultPublishTimeout
	}
	return d
}

// sinkHosts validates a --sink URL with the sink's own parser and returns
// the host names it connects to.
func sinkHosts(t testing.TB, where, raw string) []string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: sink URL does not parse", where)
		return nil
	}
	switch u.Scheme {
	case "kafka":
		cfg, err := kafkasink.ParseURL(raw)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			t.Errorf("%s: sink %s: %v", where, cfg.Redacted(), err)
			return nil
		}
		var hosts []string
		for _, b := range cfg.Brokers {
			host, _, _ := strings.Cut(b, ":")
			hosts = append(hosts, host)
		}
		return hosts
	case "amqp", "amqps":
		if _, err := amqpsink.ParseURL(raw); err != nil {
			t.Errorf("%s: sink: %v", where, err)
			return nil
		}
		return []string{u.Hostname()}
	case "nats":
		if _, err := natssink.ParseURL(raw); err != nil {
			t.Errorf("%s: sink: %v", where, err)
			return nil
		}
		return []string{u.Hostname()}
	case "redis", "rediss":
		if _, err := redissink.ParseURL(raw); err != nil {
			t.Errorf("%s: sink: %v", where, err)
			return nil
		}
		return []string{u.Hostname()}
	}
	t.Errorf("%s: sink scheme %q: the deployment examples use kafka, amqp, nats or redis; extend this test for others", where, u.Scheme)
	return nil
}
