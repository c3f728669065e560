// Package throwaway starts a test's own nats-server (with JetStream),
// redis-server, mosquitto, pgbouncer or kinesalite on a free loopback
// port, which the test may kill and start again: disruptive tests never
// touch the machine's shared servers. Each server keeps its data in a
// temporary directory (JetStream's file store; Redis' append-only file,
// written before every reply; kinesalite's LevelDB, written before every
// reply), so what it acknowledged survives a SIGKILL, and it is killed
// when the test ends.
package throwaway

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// Server is one throwaway server process.
type Server struct {
	tb   testing.TB
	name string
	bin  string
	args []string
	port int
	dir  string
	user string // pgbouncer's

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// NATS starts nats-server -js on a free port.
func NATS(tb testing.TB) *Server {
	tb.Helper()
	s := newServer(tb, "nats-server")
	s.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir}
	s.Start()
	return s
}

// Redis starts redis-server on a free port, with an append-only file
// synced before each reply (appendfsync always): the tests that kill it
// check that nothing the server acknowledged is lost, and with everysec
// Redis may acknowledge writes it has not yet written to the file (it
// postpones the write while a slow fsync runs) and lose them to a kill.
// Seen once with everysec: 11 of 2,500 entries, written just before a
// SIGKILL on a busy disk, missing from the stream while the relay had
// their acknowledgements (most likely that postponed write).
func Redis(tb testing.TB) *Server {
	tb.Helper()
	s := newServer(tb, "redis-server")
	s.args = []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir, "--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log")}
	s.Start()
	return s
}

func newServer(tb testing.TB, name string) *Server {
	bin, err := exec.LookPath(name)
	if err != nil {
		for _, p := range []string{"/usr/sbin/" + name, "/usr/bin/" + name} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		testkit.Unavailable(tb, "tool", "%s not installed (scripts/services.sh installs it): %v", name, err)
	}
	s := &Server{tb: tb, name: name, bin: bin, port: freePort(tb), dir: tb.TempDir()}
	tb.Cleanup(s.Kill)
	return s
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("throwaway: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is the server's URL (nats://…, redis://…/0 or mqtt://…; for
// pgbouncer, postgres://user@…/ without a database name: see
// DatabaseURL; for kinesalite, its endpoint http://…).
func (s *Server) URL() string {
	switch s.name {
	case "redis-server":
		return "redis://" + s.Addr() + "/0"
	case "pgbouncer":
		return "postgres://" + s.user + "@" + s.Addr() + "/"
	case "kinesalite":
		return "http://" + s.Addr()
	case "mosquitto":
		return "mqtt://" + s.Addr()
	}
	return "nats://" + s.Addr()
}

// DatabaseURL is pgbouncer's URL for database db.
func (s *Server) DatabaseURL(db string) string { return s.URL() + db }

// Start starts the server (again, on the same port and data) and waits
// until it accepts connections.
func (s *Server) Start() {
	s.tb.Helper()
	s.mu.Lock()
	cmd := exec.Command(s.bin, s.args...)
	out, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("%s-%d.out", s.name, time.Now().UnixNano())))
	if err != nil {
		s.mu.Unlock()
		s.tb.Fatalf("throwaway: %v", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		s.tb.Fatalf("throwaway: start %s: %v", s.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(done) }()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			b, _ := os.ReadFile(out.Name())
			s.tb.Fatalf("throwaway: %s exited at start: %s", s.name, b)
		default:
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("throwaway: %s not accepting on %s after 15s", s.name, s.Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the server (SIGKILL) and waits for it to exit. It is a no-op
// when the server is not running.
func (s *Server) Kill() { s.end(syscall.SIGKILL) }

// end sends the running server sig and waits for it to exit; a no-op
// when it is not running.
func (s *Server) end(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-done
}

// RedisCluster starts n redis-server processes with cluster mode on free
// ports and joins them into a cluster (redis-cli --cluster create, no
// replicas); it returns a redis:// URL listing every node.
func RedisCluster(tb testing.TB, n int) string {
	tb.Helper()
	var addrs []string
	for range n {
		s := newServer(tb, "redis-server")
		s.args = []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--dir", s.dir, "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log")}
		s.Start()
		addrs = append(addrs, s.Addr())
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testkit.Unavailable(tb, "tool", "redis-cli not installed: %v", err)
	}
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		tb.Fatalf("throwaway: redis-cli --cluster create: %v: %s", err, out)
	}
	// Wait until every node reports the cluster ok.
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		for {
			info, _ := exec.Command(cli, "-h", host, "-p", port, "cluster", "info").Output()
			if strings.Contains(string(info), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("throwaway: cluster not ok on %s: %s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return "redis://" + strings.Join(addrs, ",")
}

// PgBouncer starts pgbouncer in transaction pooling mode on a free port,
// in front of the Postgres server at target (host:port), with trust
// authentication for user, at most poolSize server connections per
// database and user, and the stock settings otherwise (it refuses start-up
// parameters it does not know, as a default installation does). Its URL
// is URL with the database's name.
func PgBouncer(tb testing.TB, target, user string, poolSize int) *Server {
	tb.Helper()
	s := newServer(tb, "pgbouncer")
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		tb.Fatalf("throwaway: pgbouncer target %q: %v", target, err)
	}
	users := filepath.Join(s.dir, "users.txt")
	ini := filepath.Join(s.dir, "pgbouncer.ini")
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
`, host, port, s.port, users, poolSize)
	for path, body := range map[string]string{ini: conf, users: fmt.Sprintf("%q \"\"\n", user)} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			tb.Fatalf("throwaway: %v", err)
		}
	}
	s.args = []string{ini}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root; it drops to an unprivileged
		// user, which must be able to read its files.
		for _, d := range []string{filepath.Dir(s.dir), s.dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				tb.Fatalf("throwaway: %v", err)
			}
		}
		s.args = []string{"-u", "postgres", ini}
	}
	s.user = user
	s.Start()
	return s
}

// OutputLines is every line the server wrote to its standard output and
// error, in every run since the test began, that contains substr (all of
// them when substr is empty): for a failing test's log.
func (s *Server) OutputLines(substr string) string {
	files, _ := filepath.Glob(filepath.Join(s.dir, s.name+"-*.out"))
	var lines []string
	for _, f := range files { // named by start time: in run order
		b, err := os.ReadFile(f)
		if err != nil {
			lines = append(lines, err.Error())
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" && strings.Contains(l, substr) {
				lines = append(lines, l)
			}
		}
	}
	return strings.Join(lines, "\n")
}
