package deploytest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks/amqpsink"
)

// TestComposeConfig validates docker-compose.yml with Compose itself
// (`docker-compose config -q`, the Debian package; `docker compose` too
// where the plugin is installed). No engine is needed.
func TestComposeConfig(t *testing.T) {
	t.Parallel()
	var tools [][]string
	if _, err := exec.LookPath("docker-compose"); err == nil {
		tools = append(tools, []string{"docker-compose"})
	}
	if _, err := exec.LookPath("docker"); err == nil {
		if exec.Command("docker", "compose", "version").Run() == nil {
			tools = append(tools, []string{"docker", "compose"})
		}
	}
	if len(tools) == 0 {
		unavailable(t, "neither docker-compose nor the docker compose plugin is installed (scripts/services.sh docker-compose installs it)")
	}
	dir := root(t)
	for _, tool := range tools {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := slices.Concat(tool[1:], []string{"--project-directory", dir, "-f", filepath.Join(dir, "docker-compose.yml"), "config", "-q"})
		cmd := exec.CommandContext(ctx, tool[0], args...)
		cmd.Dir = dir
		// Only the defaults in the file: a variable set in the caller's
		// environment must not hide a missing default.
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); k != "VERSION" && k != "POSTGRES_PORT" && !strings.HasPrefix(k, "COMPOSE_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: docker-compose.yml is invalid: %v\n%s", strings.Join(tool, " "), err, out)
		} else if len(bytes.TrimSpace(out)) > 0 {
			// Warnings (an unset variable, an obsolete key) count too.
			t.Errorf("%s config printed warnings:\n%s", strings.Join(tool, " "), out)
		}
	}
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Profiles    []string          `yaml:"profiles"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test        []string `yaml:"test"`
		Disable     bool     `yaml:"disable"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		StartPeriod string   `yaml:"start_period"`
		Retries     int      `yaml:"retries"`
	} `yaml:"healthcheck"`
	Volumes         []string `yaml:"volumes"`
	Ports           []string `yaml:"ports"`
	Restart         string   `yaml:"restart"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
}

// ours reports whether the service runs the image built from the
// Dockerfile, and which binary.
func (s composeService) ours() (bin string, ok bool) {
	if !strings.HasPrefix(s.Image, "outbox-relay:") {
		return "", false
	}
	if len(s.Entrypoint) == 0 {
		return "/outbox-relay", true
	}
	return s.Entrypoint[0], true
}

func (s composeService) oneShot() bool { return s.Restart == "no" }

// database returns the Postgres host, port and database the service uses.
func (s composeService) database(t *testing.T, name string) string {
	t.Helper()
	raw := s.Environment["OUTBOX_DATABASE_URL"]
	if raw == "" {
		raw = s.Environment["DATABASE_URL"]
	}
	if raw == "" {
		t.Errorf("service %s: no DATABASE_URL or OUTBOX_DATABASE_URL", name)
		return ""
	}
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		t.Errorf("service %s: database URL does not parse", name)
		return ""
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

func (s composeService) schema() string {
	if v := s.Environment["OUTBOX_SCHEMA"]; v != "" {
		return v
	}
	return "outbox"
}

func loadCompose(t *testing.T) (composeFile, *yaml.Node) {
	t.Helper()
	raw := readFile(t, "docker-compose.yml")
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v (entrypoint, command and healthcheck test must be lists: exec form)", err)
	}
	return cf, &doc
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	cf, doc := loadCompose(t)

	for _, name := range []string{"postgres", "kafka", "migrate", "relay", "demo"} {
		if _, ok := cf.Services[name]; !ok {
			t.Errorf("docker-compose.yml has no %s service", name)
		}
	}

	// `restart: no` unquoted is the boolean false to YAML 1.1 parsers
	// (docker-compose v1), which reject it.
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "restart" && v.Kind == yaml.ScalarNode && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 &&
				slices.Contains([]string{"no", "No", "NO", "false", "off"}, v.Value) {
				t.Errorf("docker-compose.yml line %d: restart: %s must be quoted (\"no\")", v.Line, v.Value)
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(doc)

	for name, s := range cf.Services {
		bin, ours := s.ours()
		switch {
		case s.oneShot():
		case s.Healthcheck == nil:
			t.Errorf("service %s runs for good but has no healthcheck", name)
		case s.Healthcheck.Disable:
			// The demo producer has no health endpoint, and the image's
			// HEALTHCHECK is the relay's.
			if bin != "/outbox-demo" {
				t.Errorf("service %s disables its healthcheck; only the demo producer may", name)
			}
		case len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD":
			t.Errorf("service %s: healthcheck test %q: want exec form [\"CMD\", ...]", name, s.Healthcheck.Test)
		}
		if s.Healthcheck != nil && !s.Healthcheck.Disable {
			for _, d := range []string{s.Healthcheck.Interval, s.Healthcheck.Timeout, s.Healthcheck.StartPeriod} {
				if _, err := time.ParseDuration(d); d != "" && err != nil {
					t.Errorf("service %s: healthcheck duration %q", name, d)
				}
			}
		}
		if ours && bin != "/outbox-relay" && bin != "/outbox-demo" {
			t.Errorf("service %s: entrypoint %s is not a binary of the image", name, bin)
		}
		// The image's HEALTHCHECK asks the relay's admin listener: only a
		// relay can pass it.
		if ours && !(bin == "/outbox-relay" && len(s.Command) > 0 && s.Command[0] == "run") &&
			(s.Healthcheck == nil || !s.Healthcheck.Disable) {
			t.Errorf("service %s runs %s %q: disable the image's relay healthcheck (healthcheck: {disable: true})", name, bin, s.Command)
		}

		for dep, d := range s.DependsOn {
			ds, ok := cf.Services[dep]
			if !ok {
				t.Errorf("service %s depends on unknown service %s", name, dep)
				continue
			}
			switch d.Condition {
			case "service_healthy":
				if ds.Healthcheck == nil || ds.Healthcheck.Disable || len(ds.Healthcheck.Test) == 0 {
					t.Errorf("service %s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
				}
			case "service_completed_successfully":
				if !ds.oneShot() {
					t.Errorf("service %s waits for %s to complete, but %s is not a one-shot (restart: \"no\")", name, dep, dep)
				}
			default:
				t.Errorf("service %s: depends_on %s with condition %q; use service_healthy or service_completed_successfully", name, dep, d.Condition)
			}
			// A dependency must be enabled whenever the service is.
			for _, p := range ds.Profiles {
				if !slices.Contains(s.Profiles, p) {
					t.Errorf("service %s depends on %s, which only runs with profile %s", name, dep, p)
				}
			}
		}
	}

	pg, ok := cf.Services["postgres"]
	if ok {
		named := false
		for _, v := range pg.Volumes {
			src, dst, _ := strings.Cut(v, ":")
			if _, declared := cf.Volumes[src]; declared && strings.HasPrefix(dst, "/var/lib/postgresql/data") {
				named = true
			}
		}
		if !named {
			t.Error("postgres does not keep its data in a named volume (top-level volumes:)")
		}
	}
}

// TestComposeRelays checks every relay service: it starts after its schema
// is migrated and its broker is up, its sink URL parses, docker waits long
// enough for its drain, and no two relays share an outbox.
func TestComposeRelays(t *testing.T) {
	t.Parallel()
	cf, _ := loadCompose(t)

	outboxes := map[string]string{} // database/schema -> relay
	relays := 0
	for name, s := range cf.Services {
		bin, ours := s.ours()
		if !ours {
			continue
		}
		isRelay := bin == "/outbox-relay" && len(s.Command) > 0 && s.Command[0] == "run"
		isDemo := bin == "/outbox-demo"
		if !isRelay && !isDemo {
			continue
		}
		db := s.database(t, name)
		outbox := db + "/" + s.schema()

		// It must start after `outbox-relay migrate` of its own schema.
		migrated := false
		for dep, d := range s.DependsOn {
			ds := cf.Services[dep]
			if d.Condition == "service_completed_successfully" && slices.Equal(ds.Command, []string{"migrate"}) &&
				ds.database(t, dep)+"/"+ds.schema() == outbox {
				migrated = true
			}
		}
		if !migrated {
			t.Errorf("service %s does not depend on a migrate service of schema %s completing (condition: service_completed_successfully)", name, s.schema())
		}
		if !isRelay {
			continue
		}
		relays++
		if other, dup := outboxes[outbox]; dup {
			t.Errorf("relays %s and %s share the outbox schema %s of one database: each message would reach only one of their sinks", name, other, s.schema())
		}
		outboxes[outbox] = name

		set := relaySettings{args: s.Command[1:], env: s.Environment}
		if s.Healthcheck == nil || !slices.Equal(s.Healthcheck.Test, []string{"CMD", "/outbox-relay", "healthcheck"}) {
			t.Errorf("service %s: healthcheck test must be [CMD /outbox-relay healthcheck]", name)
		}
		if addr, ok := set.flag("admin-addr"); ok && !strings.HasSuffix(addr, ":"+strconv.Itoa(adminPort)) {
			t.Errorf("service %s: admin-addr %s; the image's healthcheck and EXPOSE use port %d", name, addr, adminPort)
		}

		sink, ok := set.flag("sink")
		if !ok {
			t.Errorf("service %s: no --sink or OUTBOX_SINK", name)
			continue
		}
		for _, host := range sinkHosts(t, "service "+name, sink) {
			if d, ok := s.DependsOn[host]; !ok || d.Condition != "service_healthy" {
				t.Errorf("service %s publishes to %s but does not wait for it to be healthy", name, host)
			}
		}
		if strings.HasPrefix(sink, "kafka:") && cf.Services["kafka"].Environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false" {
			created := false
			for dep, d := range s.DependsOn {
				c := cf.Services[dep].Command
				i := slices.Index(c, "--topic")
				if d.Condition == "service_completed_successfully" && slices.Contains(c, "--create") && i >= 0 && i+1 < len(c) && c[i+1] == demoTopic {
					created = true
				}
			}
			if !created {
				t.Errorf("service %s: Kafka does not create topics and nothing the relay waits for creates %q", name, demoTopic)
			}
		}

		grace := 10 * time.Second // Compose's default
		if s.StopGracePeriod != "" {
			var err error
			if grace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
				t.Errorf("service %s: stop_grace_period %q", name, s.StopGracePeriod)
			}
		}
		if drain := set.drainTimeout(t); grace <= drain+afterDrain {
			t.Errorf("service %s: stop_grace_period %s must exceed the drain timeout %s plus %s for closing the admin listener and the sink, or docker kills the relay mid-drain",
				name, grace, drain, afterDrain)
		}
	}
	if relays == 0 {
		t.Error("docker-compose.yml has no relay service (outbox-relay run)")
	}
}

// TestComposeRabbitMQ checks that the broker the AMQP relay publishes to
// has what the relay needs: its user with that password, the exchange,
// and a queue bound for the demo's topic (an unroutable message is
// dead-lettered).
func TestComposeRabbitMQ(t *testing.T) {
	t.Parallel()
	cf, _ := loadCompose(t)
	var relayName string
	var sink string
	for name, s := range cf.Services {
		if v, ok := (relaySettings{args: s.Command, env: s.Environment}).flag("sink"); ok && strings.HasPrefix(v, "amqp") {
			relayName, sink = name, v
		}
	}
	if sink == "" {
		// The rabbitmq profile's relay is what this test checks; a compose
		// file without it is a regression, not a reason to skip for ever.
		t.Fatal("docker-compose.yml has no AMQP relay (a service running `outbox-relay run --sink amqp://...`, relay-amqp in the rabbitmq profile)")
	}
	cfg, err := amqpsink.ParseURL(sink)
	if err != nil {
		t.Fatalf("service %s: %v", relayName, err)
	}
	u, _ := url.Parse(sink)
	user := u.User.Username()
	pass, _ := u.User.Password()
	vhost := "/"
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		vhost, _ = url.PathUnescape(p)
	}

	broker, ok := cf.Services[u.Hostname()]
	if !ok {
		t.Fatalf("service %s publishes to %s, which is not a service", relayName, u.Hostname())
	}
	mounts := map[string]string{} // container path -> repository path
	for _, v := range broker.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && strings.HasPrefix(parts[0], "./") {
			mounts[parts[1]] = strings.TrimPrefix(parts[0], "./")
		}
	}
	var defsPath string
	for dst, src := range mounts {
		if path.Dir(dst) != "/etc/rabbitmq/conf.d" {
			continue
		}
		m := regexp.MustCompile(`(?m)^\s*load_definitions\s*=\s*(\S+)`).FindSubmatch(readFile(t, src))
		if m != nil {
			defsPath = mounts[string(m[1])]
			if defsPath == "" {
				t.Fatalf("%s loads %s, which the %s service does not mount", src, m[1], u.Hostname())
			}
		}
	}
	if defsPath == "" {
		t.Fatalf("service %s: no conf.d file with load_definitions: the exchange %q would not exist", u.Hostname(), cfg.Exchange)
	}

	var defs struct {
		Vhosts []struct{ Name string }
		Users  []struct {
			Name             string
			PasswordHash     string `json:"password_hash"`
			HashingAlgorithm string `json:"hashing_algorithm"`
		}
		Permissions []struct{ User, Vhost, Configure, Write, Read string }
		Exchanges   []struct {
			Name, Vhost, Type string
			Durable           bool
		}
		Queues []struct {
			Name, Vhost string
			Durable     bool
		}
		Bindings []struct {
			Source, Vhost, Destination string
			DestinationType            string `json:"destination_type"`
			RoutingKey                 string `json:"routing_key"`
		}
	}
	dec := json.NewDecoder(bytes.NewReader(readFile(t, defsPath)))
	if err := dec.Decode(&defs); err != nil {
		t.Fatalf("%s: %v", defsPath, err)
	}

	if !slices.ContainsFunc(defs.Vhosts, func(v struct{ Name string }) bool { return v.Name == vhost }) {
		t.Errorf("%s: no vhost %q (importing definitions at boot skips the default one)", defsPath, vhost)
	}
	userOK := false
	for _, du := range defs.Users {
		if du.Name != user {
			continue
		}
		// rabbit_password_hashing_sha256: base64(salt(4) ++ sha256(salt ++ password)).
		b, err := base64.StdEncoding.DecodeString(du.PasswordHash)
		if du.HashingAlgorithm != "rabbit_password_hashing_sha256" || err != nil || len(b) != 4+sha256.Size {
			t.Errorf("%s: user %s: want a rabbit_password_hashing_sha256 password_hash", defsPath, user)
			continue
		}
		sum := sha256.Sum256(append(slices.Clone(b[:4]), pass...))
		if !bytes.Equal(sum[:], b[4:]) {
			t.Errorf("%s: user %s: password_hash is not the password in %s's sink URL", defsPath, user, relayName)
			continue
		}
		userOK = true
	}
	if !userOK {
		t.Errorf("%s: no usable user %q (importing definitions at boot skips the default user)", defsPath, user)
	}
	if !slices.ContainsFunc(defs.Permissions, func(p struct{ User, Vhost, Configure, Write, Read string }) bool {
		return p.User == user && p.Vhost == vhost && regexp.MustCompile("^(?:"+p.Write+")$").MatchString(cfg.Exchange)
	}) {
		t.Errorf("%s: user %s may not write to exchange %s in vhost %s", defsPath, user, cfg.Exchange, vhost)
	}

	exType := ""
	for _, e := range defs.Exchanges {
		if e.Name == cfg.Exchange && e.Vhost == vhost {
			exType = e.Type
			if !e.Durable {
				t.Errorf("%s: exchange %s is not durable", defsPath, e.Name)
			}
		}
	}
	if exType == "" {
		t.Fatalf("%s: no exchange %q in vhost %q", defsPath, cfg.Exchange, vhost)
	}
	// The routing key is the outbox topic unless the URL says otherwise.
	routingKey := strings.ReplaceAll(u.Query().Get("routing_key"), "{topic}", demoTopic)
	if routingKey == "" {
		routingKey = demoTopic
	}
	routed := false
	for _, b := range defs.Bindings {
		if b.Source != cfg.Exchange || b.Vhost != vhost || b.DestinationType != "queue" {
			continue
		}
		if (exType == "topic" && topicMatch(b.RoutingKey, routingKey)) || (exType == "direct" && b.RoutingKey == routingKey) || exType == "fanout" {
			for _, q := range defs.Queues {
				if q.Name == b.Destination && q.Vhost == vhost {
					routed = true
					if !q.Durable {
						t.Errorf("%s: queue %s is not durable", defsPath, q.Name)
					}
				}
			}
		}
	}
	if !routed {
		t.Errorf("%s: no queue is bound to exchange %s for routing key %q: every demo event would be dead-lettered as unroutable", defsPath, cfg.Exchange, routingKey)
	}
}

// topicMatch matches an AMQP topic-exchange binding key (* one word, # any
// number of words) against a routing key.
func topicMatch(pattern, key string) bool {
	var match func(p, k []string) bool
	match = func(p, k []string) bool {
		switch {
		case len(p) == 0:
			return len(k) == 0
		case p[0] == "#":
			for i := 0; i <= len(k); i++ {
				if match(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case len(k) == 0:
			return false
		case p[0] == "*" || p[0] == k[0]:
			return match(p[1:], k[1:])
		}
		return false
	}
	return match(strings.Split(pattern, "."), strings.Split(key, "."))
}

func TestTopicMatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p, k string
		want bool
	}{
		{"orders", "orders", true}, {"orders", "order", false}, {"#", "orders", true}, {"orders.#", "orders", true},
		{"orders.*", "orders", false}, {"*.created", "orders.created", true}, {"a.#.z", "a.b.c.z", true}, {"a.#.z", "a.b.c", false},
	} {
		if got := topicMatch(c.p, c.k); got != c.want {
			t.Errorf("topicMatch(%q, %q) = %v, want %v", c.p, c.k, got, c.want)
		}
	}
}

// TestComposeImagesPinned: every image of the stack names a release (a
// tag with a minor version at least), so that `docker compose up` next
// month runs what was tested; our own image is versioned by VERSION.
func TestComposeImagesPinned(t *testing.T) {
	cf, _ := loadCompose(t)
	pinned := regexp.MustCompile(`:v?[0-9]+\.[0-9]+`)
	for name, s := range cf.Services {
		if _, ours := s.ours(); ours || s.Image == "" {
			continue
		}
		if !pinned.MatchString(s.Image) {
			t.Errorf("service %s: image %q is not pinned to a release (name at least major.minor)", name, s.Image)
		}
	}
}
