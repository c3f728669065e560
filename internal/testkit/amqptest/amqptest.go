// Package amqptest starts a throwaway RabbitMQ node for a test that stops,
// restarts or reconfigures the broker (stop_app, a memory alarm), so that
// the shared broker at TEST_AMQP_URL is only ever used, never disturbed.
//
// Tests that only publish and consume use the shared broker; this package
// does not know about it.
package amqptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/testproc"
)

// Broker is a throwaway RabbitMQ node of one test, made by Server.
type Broker struct {
	proc    *testproc.Instance
	server  string // rabbitmq-server script
	ctl     string // rabbitmqctl
	node    string
	url     string
	env     []string
	log     string
	pidFile string
	exited  chan struct{} // closed when the server process has exited
}

// Server starts a RabbitMQ node of the test's own: its own node name,
// AMQP, distribution and epmd ports on loopback, and its data, log and
// configuration in a temporary directory (nothing is read from
// /etc/rabbitmq). It is killed and its directory removed when the test
// ends, whether it passed, failed or panicked. Without rabbitmq-server the
// test is skipped, or fails under CI=true, saying what to install.
//
// Binaries: TEST_RABBITMQ_BIN (a directory with rabbitmq-server and
// rabbitmqctl), else /usr/lib/rabbitmq/bin (Debian's real scripts: the
// /usr/sbin wrappers switch to the rabbitmq user and log to
// /var/log/rabbitmq), else rabbitmq-server on PATH.
func Server(t testing.TB) *Broker {
	t.Helper()
	bin, err := rabbitBin()
	if err != nil {
		pgtest.Unavailable(t, "a throwaway RabbitMQ node needs rabbitmq-server and rabbitmqctl: %v "+
			"(Debian: apt-get install rabbitmq-server; or set TEST_RABBITMQ_BIN to their directory)", err)
	}
	proc, err := testproc.New(t, "outbox-amqptest-", "")
	if errors.Is(err, testproc.ErrUnsupported) {
		pgtest.Unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("throwaway RabbitMQ: %v", err)
	}
	b := &Broker{
		proc:    proc,
		server:  filepath.Join(bin, "rabbitmq-server"),
		ctl:     filepath.Join(bin, "rabbitmqctl"),
		node:    testkit.RandName("outbox-test-") + "@localhost",
		log:     filepath.Join(proc.Dir, "server.log"),
		pidFile: filepath.Join(proc.Dir, "rabbitmq.pid"),
		exited:  make(chan struct{}),
	}
	close(b.exited) // no server yet
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("throwaway RabbitMQ %s", b.logTail(30))
		}
		if err := proc.KillAll(); err != nil {
			t.Errorf("throwaway RabbitMQ: %v", err)
		}
		<-b.exited
	})
	start := time.Now()
	// Ports free a moment ago may be taken by the time the node binds
	// them (seen: the distribution port, by the ephemeral port of the
	// rabbitmqctl that waits for the node, "dist_port_already_used"):
	// try others.
	for attempt := 1; ; attempt++ {
		err := b.start()
		if err == nil {
			break
		}
		if tail := testproc.Tail(b.log, 50); attempt == 3 || !(strings.Contains(tail, "eaddrinuse") || strings.Contains(tail, "dist_port_already_used")) {
			t.Fatalf("throwaway RabbitMQ: %v", err)
		}
		if err := proc.KillAll(); err != nil {
			t.Fatalf("throwaway RabbitMQ: %v", err)
		}
		<-b.exited
	}
	t.Logf("throwaway RabbitMQ node %s at %s, ready after %s", b.node, b.url, time.Since(start).Round(time.Millisecond))
	return b
}

// URL is the node's AMQP URL (user guest, vhost /).
func (b *Broker) URL() string { return b.url }

// Node is the node's Erlang name, for rabbitmqctl -n.
func (b *Broker) Node() string { return b.node }

// Ctl runs rabbitmqctl against the node and returns its output.
func (b *Broker) Ctl(ctx context.Context, args ...string) (string, error) {
	out, err := b.run(ctx, b.ctl, append([]string{"-n", b.node}, args...)...)
	if err != nil {
		return out, fmt.Errorf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return out, nil
}

// StopApp stops the RabbitMQ application (the node stays up): every
// connection is closed and new ones are refused until StartApp.
func (b *Broker) StopApp(ctx context.Context) error {
	_, err := b.Ctl(ctx, "stop_app")
	return err
}

// StartApp starts the RabbitMQ application again and returns once it has
// finished booting.
func (b *Broker) StartApp(ctx context.Context) error {
	if _, err := b.Ctl(ctx, "start_app"); err != nil {
		return err
	}
	_, err := b.Ctl(ctx, "await_startup")
	return err
}

// start starts the node on fresh ports and waits until it has booted.
func (b *Broker) start() error {
	var ports [3]int
	for i := range ports {
		p, err := testproc.FreePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	dir := b.proc.Dir
	files := map[string]string{
		"rabbitmq.conf":     fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\n", amqpPort),
		"rabbitmq-env.conf": "",
		"enabled_plugins":   "[].\n",
	}
	if _, err := os.Stat(filepath.Join(dir, ".erlang.cookie")); err != nil {
		files[".erlang.cookie"] = erlangCookie()
	}
	for name, text := range files {
		mode := os.FileMode(0o644)
		if name == ".erlang.cookie" {
			mode = 0o400 // Erlang refuses a cookie others can read
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), mode); err != nil {
			return err
		}
	}
	b.url = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)
	b.env = []string{
		"HOME=" + dir, // the Erlang cookie, for the node and rabbitmqctl
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE=" + b.pidFile,
		"RABBITMQ_NODENAME=" + b.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", amqpPort),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", distPort),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		// rabbitmqctl's own distribution port: any free one, not the
		// default range of 11 that every rabbitmqctl on the machine shares.
		"RABBITMQ_CTL_DIST_PORT_MIN=0", "RABBITMQ_CTL_DIST_PORT_MAX=0",
		// An epmd of its own (the node starts it): the machine's epmd,
		// and the nodes registered there, are left alone.
		fmt.Sprintf("ERL_EPMD_PORT=%d", epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
	logf, err := os.OpenFile(b.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_ = os.Remove(b.pidFile)
	cmd := b.proc.Command(b.server, nil, b.env, "RABBITMQ_", "ERL_", "HOME=")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	b.exited = exited
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	// rabbitmqctl wait: the pid file, then the distribution, then the
	// application. It would notice a dead node only after a while, so
	// watch the process too.
	// Booting takes about 10 s of CPU: minutes on a machine loaded 20 deep.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := b.Ctl(ctx, "wait", "--timeout", "290", b.pidFile); err != nil {
		select {
		case <-exited:
			return fmt.Errorf("rabbitmq-server exited during boot: %s\n%s", cmd.ProcessState, b.logTail(20))
		default:
			return fmt.Errorf("%v\n%s", err, b.logTail(20))
		}
	}
	return nil
}

// logTail returns the ends of the node's output and of its own log file
// (where it logs once booted far enough), for failure messages.
func (b *Broker) logTail(n int) string {
	nodeLog := filepath.Join(b.proc.Dir, "log", b.node+".log")
	return fmt.Sprintf("output (tail):\n%s\nlog %s (tail):\n%s", testproc.Tail(b.log, n), nodeLog, testproc.Tail(nodeLog, n))
}

// run runs one of the node's programs with the node's environment.
func (b *Broker) run(ctx context.Context, name string, args ...string) (string, error) {
	return testproc.Output(ctx, b.proc.Command(name, args, b.env, "RABBITMQ_", "ERL_", "HOME="))
}

// rabbitBin finds the directory holding rabbitmq-server and rabbitmqctl.
func rabbitBin() (string, error) {
	has := func(dir string) bool {
		for _, p := range []string{"rabbitmq-server", "rabbitmqctl"} {
			if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("TEST_RABBITMQ_BIN"); dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("TEST_RABBITMQ_BIN=%s has no rabbitmq-server and rabbitmqctl", dir)
		}
		return dir, nil
	}
	if has("/usr/lib/rabbitmq/bin") {
		return "/usr/lib/rabbitmq/bin", nil
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && filepath.Base(real) == "rabbitmq-server" && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	return "", errors.New("rabbitmq-server not found in /usr/lib/rabbitmq/bin nor on PATH")
}

// erlangCookie is a random secret the node and rabbitmqctl share.
func erlangCookie() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))
}
