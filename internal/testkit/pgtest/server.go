package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit/testproc"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Instance is a throwaway PostgreSQL server of one test, made by Server,
// or of a program that is not a test (a benchmark), made by Start.
// A test that restarts, stops, kills or reconfigures a server uses one of
// these, never the shared server at URL(): other tests, and other people,
// are using that one.
type Instance struct {
	proc   *testproc.Instance
	pgCtl  string
	data   string
	log    string
	url    string
	port   int
	inited time.Duration // initdb's time
	ready  time.Duration // from the start of initdb to accepting connections
}

// ErrUnavailable is returned (wrapped) by Start when this machine cannot
// run a throwaway server: no initdb and pg_ctl, or not Linux.
var ErrUnavailable = errors.New("throwaway PostgreSQL unavailable")

// Server starts a PostgreSQL server of its own for the test: initdb into a
// temporary directory, pg_ctl start on a free loopback port, trust
// authentication, fsync off (nothing in it outlives the test). It is
// killed and its directory removed when the test ends, whether it passed,
// failed or panicked. Without initdb and pg_ctl the test is skipped, or
// fails under CI=true, saying what to install.
//
// Binaries: TEST_PG_BIN (a directory), else initdb on PATH, else the
// newest /usr/lib/postgresql/<version>/bin. Running as root, the server
// runs as the OS user postgres.
func Server(t testing.TB) *Instance {
	t.Helper()
	return ServerConf(t)
}

// ServerConf is Server with extra postgresql.conf lines, such as
// "wal_level = logical".
func ServerConf(t testing.TB, conf ...string) *Instance {
	t.Helper()
	return ServerWith(t, Options{Conf: conf})
}

// Options are what ServerWith sets up beyond what Server does.
type Options struct {
	// Conf are extra postgresql.conf lines, such as "wal_level = logical".
	Conf []string
	// PasswordAuth makes the server ask every role but postgres for its
	// password (scram-sha-256) on TCP connections, replication
	// connections included. postgres, and every role on the Unix socket,
	// stay trusted, so that URL, Pool and Schema work as on any throwaway
	// server; a role gets its password with CREATE ROLE ... PASSWORD.
	PasswordAuth bool
}

// hbaPassword is pg_hba.conf under Options.PasswordAuth. A connection
// takes the first line that matches it: postgres is trusted before the
// lines that ask every other role for a password.
const hbaPassword = `# throwaway test server (internal/testkit/pgtest), Options.PasswordAuth
local all         all                    trust
local replication all                    trust
host  all         postgres 127.0.0.1/32 trust
host  replication postgres 127.0.0.1/32 trust
host  all         all      127.0.0.1/32 scram-sha-256
host  replication all      127.0.0.1/32 scram-sha-256
`

// ServerWith is Server set up as o says.
func ServerWith(t testing.TB, o Options) *Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := start(ctx, t.Logf, o)
	if errors.Is(err, ErrUnavailable) {
		Unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Logf("throwaway PostgreSQL on 127.0.0.1:%d in %s (initdb %s, ready after %s)", s.port, s.proc.Dir,
		s.inited.Round(time.Millisecond), s.ready.Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("throwaway PostgreSQL log (tail):\n%s", testproc.Tail(s.log, 30))
		}
		// No shutdown checkpoint to wait for: the whole directory goes.
		if err := s.Close(); err != nil {
			t.Errorf("throwaway PostgreSQL: %v", err)
		}
	})
	return s
}

// Start is ServerConf for a program that is not a test: it starts a
// throwaway server with the extra postgresql.conf lines conf, the same
// way, and returns once it accepts connections. The server is the
// caller's to Close; one left behind by a process that died is reaped by
// the next Start or Server. Errors wrap ErrUnavailable when this machine
// cannot run one.
func Start(ctx context.Context, conf ...string) (*Instance, error) {
	return start(ctx, nil, Options{Conf: conf})
}

// start makes the instance directory, runs initdb and starts the server
// as o says; on error nothing of it is left. logf (nil: silent) hears of
// stale instances reaped.
func start(ctx context.Context, logf func(string, ...any), o Options) (*Instance, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, fmt.Errorf("%w: a throwaway PostgreSQL server needs initdb and pg_ctl: %v "+
			"(Debian: apt-get install postgresql; or set TEST_PG_BIN to their directory)", ErrUnavailable, err)
	}
	proc, err := testproc.Create("outbox-pgtest-", "postgres", logf)
	if errors.Is(err, testproc.ErrUnsupported) {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if err != nil {
		return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
	}
	s := &Instance{
		proc:  proc,
		pgCtl: filepath.Join(bin, "pg_ctl"),
		data:  filepath.Join(proc.Dir, "data"),
		log:   filepath.Join(proc.Dir, "postgres.log"),
	}
	if err := s.init(ctx, bin, o); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
	}
	s.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	return s, nil
}

// init runs initdb, writes the configuration and starts the server on a
// free port.
func (s *Instance) init(ctx context.Context, bin string, o Options) error {
	begin := time.Now()
	if out, err := s.run(ctx, filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	s.inited = time.Since(begin)
	conf := o.Conf
	if o.PasswordAuth {
		// The file initdb wrote belongs to the server's OS user: replace
		// its content, keeping the file.
		if err := replaceFile(filepath.Join(s.data, "pg_hba.conf"), hbaPassword); err != nil {
			return err
		}
		// Servers before 14 store md5 by default, which a scram-sha-256
		// line refuses.
		conf = append([]string{"password_encryption = 'scram-sha-256'"}, conf...)
	}
	// A port free a moment ago may be taken by the time the server binds
	// it: try another.
	for attempt := 1; ; attempt++ {
		var err error
		if s.port, err = testproc.FreePort(); err != nil {
			return fmt.Errorf("free port: %w", err)
		}
		lines := fmt.Sprintf("\n# throwaway test server (internal/testkit/pgtest)\nport = %d\nlisten_addresses = '127.0.0.1'\n"+
			"unix_socket_directories = '%s'\nfsync = off\nfull_page_writes = off\n", s.port, s.proc.Dir)
		for _, c := range conf {
			lines += c + "\n"
		}
		if err := appendFile(filepath.Join(s.data, "postgresql.auto.conf"), lines); err != nil {
			return err
		}
		if err = s.Start(ctx); err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(testproc.Tail(s.log, 20), "could not bind") {
			return err
		}
	}
	s.ready = time.Since(begin)
	return nil
}

// Close kills the server (SIGKILL: no shutdown checkpoint to wait for)
// and removes its directory.
func (s *Instance) Close() error { return s.proc.Remove() }

// URL is the server's connection URL (user postgres, database postgres).
func (s *Instance) URL() string { return s.url }

// Pool connects to the server, like the package's Pool does to the shared
// one. The pool is closed when the test ends.
func (s *Instance) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return connect(t, s.url)
}

// Schema creates and migrates a schema named after the test on the server.
// It is not dropped at the end: the server goes.
func (s *Instance) Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := s.Pool(t), SchemaName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatalf("migrate %q: %v", schema, err)
	}
	return pool, schema
}

// Start starts the server and returns once it accepts connections.
func (s *Instance) Start(ctx context.Context) error {
	return s.ctl(ctx, "start", "-l", s.log)
}

// Stop shuts the server down in fast mode (sessions are ended, like an
// operator's restart) and returns once it is down.
func (s *Instance) Stop(ctx context.Context) error {
	return s.ctl(ctx, "stop", "-m", "fast")
}

// Restart is Stop then Start: it returns once the server accepts
// connections again.
func (s *Instance) Restart(ctx context.Context) error {
	return s.ctl(ctx, "restart", "-m", "fast", "-l", s.log)
}

// Kill sends SIGKILL to the postmaster and every backend at once, as a
// crash of the machine would: the next Start runs crash recovery. It
// returns once they are gone.
func (s *Instance) Kill() error {
	return s.proc.KillAll()
}

func (s *Instance) ctl(ctx context.Context, action string, args ...string) error {
	full := append([]string{action, "-D", s.data, "-w", "-t", "120"}, args...)
	if out, err := s.run(ctx, s.pgCtl, full...); err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s\nserver log (tail):\n%s", action, err, out, testproc.Tail(s.log, 20))
	}
	return nil
}

// run runs one of the server's programs as the server's user; the output
// is for error messages.
func (s *Instance) run(ctx context.Context, name string, args ...string) (string, error) {
	return testproc.Output(ctx, s.proc.Command(name, args, []string{"LC_ALL=C"}, "PG"))
}

// replaceFile writes text over the content of the existing file path.
func replaceFile(path, text string) error { return writeExisting(path, text, os.O_TRUNC) }

// appendFile adds text at the end of the existing file path.
func appendFile(path, text string) error { return writeExisting(path, text, os.O_APPEND) }

// writeExisting writes text into the existing file path, opened with
// flag (truncating or appending) besides O_WRONLY.
func writeExisting(path, text string, flag int) error {
	f, err := os.OpenFile(path, flag|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pgBin finds the directory holding initdb and pg_ctl.
func pgBin() (string, error) {
	has := func(dir string) bool {
		for _, p := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("TEST_PG_BIN"); dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("TEST_PG_BIN=%s has no initdb and pg_ctl", dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", errors.New("initdb not found on PATH nor in /usr/lib/postgresql/*/bin")
}

func pgVersion(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}
