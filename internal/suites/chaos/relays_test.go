package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// proc is one outbox-relay process. A slot ("r1") is restarted under a new
// generation ("r1.3") each time its process dies.
type proc struct {
	*testkit.Relay
	slot    string
	gen     int
	id      string
	logPath string

	// Guarded by cluster.mu, set before the test sends its signal.
	killed  bool // SIGKILL from the test
	termed  bool // SIGTERM from the test
	restart bool // SIGTERM for a rolling restart: start it again
}

// cluster runs and supervises relay processes like an orchestrator would:
// a process that dies is started again under the same slot, unless the
// test stopped it on purpose.
type cluster struct {
	t       *testing.T
	bin     string
	dir     string
	dbURL   string
	schema  string
	appName string
	args    []string
	// slotURL, when set for a slot, is its database URL instead of dbURL
	// (relays through a PgBouncer beside direct ones).
	slotURL map[string]string
	// sources, when set, is a config file with a sources list: the
	// relays run with --config sources instead of --database-url and
	// --schema, and relay from every source in it.
	sources string

	mu         sync.Mutex
	current    map[string]*proc
	all        []*proc
	stopped    map[string]bool // slots stopped on purpose: not restarted
	unexpected []string        // processes that exited without being told to
	// tolerateExit says whether an exit the test did not cause is expected
	// (a relay started while PostgreSQL is down exits 1).
	tolerateExit func(p *proc) bool
	wg           sync.WaitGroup
	kills        int
	pauses       int
}

// atRandomIntervals calls act(n), n = 1, 2, …, each time after a random
// wait in [span[0], span[1]), until stop is closed or ctx ends: the pace
// of the tests' kills.
func atRandomIntervals(ctx context.Context, rng *rand.Rand, span [2]time.Duration, stop <-chan struct{}, act func(n int)) {
	for n := 1; ; n++ {
		tm := time.NewTimer(span[0] + time.Duration(rng.Int64N(int64(span[1]-span[0]))))
		select {
		case <-stop:
			tm.Stop()
			return
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C:
		}
		act(n)
	}
}

// relayArgs is how the relays run in every test: small batches and fast
// leases so that failover and rebalancing happen within the test, and
// retries fast and plentiful so that nothing is dead-lettered during a
// sink outage or a database restart.
func relayArgs(sinkURL string) []string {
	return []string{
		"--sink", sinkURL,
		"--workers", "2",
		"--batch-size", "200",
		"--poll-interval", "100ms",
		"--lease-ttl", "3s",
		"--retry-initial", "50ms",
		"--retry-max", "500ms",
		"--max-attempts", "1000",
		// Short, so that a stalled receiver makes sends time out.
		"--publish-timeout", "2s",
		"--drain-timeout", drainTimeout.String(),
		"--log-level", "info",
		// Several relays on one host: no fixed port for the admin listener.
		"--admin-addr", "127.0.0.1:0",
	}
}

// drainTimeout is the relays' --drain-timeout: SIGTERM must end a relay
// within it (plus exitSlack for releasing lanes and closing the sink,
// stretched by the machine's load: testkit.LoadScaled).
const (
	drainTimeout = 5 * time.Second
	exitSlack    = 5 * time.Second
)

func newCluster(t *testing.T, bin, baseURL, schema string, args []string) *cluster {
	t.Helper()
	app := "chaos-" + schema
	if len(app) > 63 {
		t.Fatalf("application_name %q is longer than Postgres keeps (63)", app)
	}
	dir := t.TempDir()
	if keep := os.Getenv("CHAOS_LOG_DIR"); keep != "" {
		// Keep the relays' logs after the test, for a post-mortem.
		dir = filepath.Join(keep, schema)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("CHAOS_LOG_DIR: %v", err)
		}
		t.Logf("relay logs in %s", dir)
	}
	c := &cluster{
		t: t, bin: bin, dir: dir, schema: schema, appName: app,
		dbURL:   withAppName(baseURL, app),
		args:    args,
		current: map[string]*proc{},
		stopped: map[string]bool{},
	}
	t.Cleanup(c.cleanup)
	return c
}

// withAppName gives the relays' sessions an application_name of their own,
// so that the test terminates its relays' backends and nobody else's.
// relay.NewPool keeps an application_name given in the URL.
func withAppName(raw, app string) string {
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return raw + " application_name=" + app
}

// start launches slot and keeps it running until stop or the end of the
// test.
func (c *cluster) start(slot string) {
	c.t.Helper()
	p, err := c.launch(slot)
	if err != nil {
		c.t.Fatalf("start relay %s: %v", slot, err)
	}
	c.wg.Add(1)
	go c.supervise(slot, p)
}

func (c *cluster) launch(slot string) (*proc, error) {
	// Under the lock, so that a slot being stopped is never started again.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped[slot] {
		return nil, errStopped
	}
	gen := 1
	if old := c.current[slot]; old != nil {
		gen = old.gen + 1
	}
	id := fmt.Sprintf("%s.%d", slot, gen)
	p := &proc{slot: slot, gen: gen, id: id, logPath: filepath.Join(c.dir, id+".log")}
	f, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	dbURL := c.dbURL
	if u, ok := c.slotURL[slot]; ok {
		dbURL = u
	}
	args := []string{"run", "--id", id, "--database-url", dbURL, "--schema", c.schema}
	if c.sources != "" {
		args = []string{"run", "--id", id, "--config", c.sources}
	}
	args = append(args, c.args...)
	r, err := testkit.StartRelay(context.Background(), testkit.RelayConfig{
		Bin: c.bin, Args: args, Stdout: f, Stderr: f, SysProcAttr: sysProcAttr(),
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	p.Relay = r
	go func() {
		<-r.Done()
		f.Close()
	}()
	c.current[slot] = p
	c.all = append(c.all, p)
	return p, nil
}

var errStopped = errors.New("slot stopped")

// supervise restarts slot whenever its process dies, until the slot is
// stopped on purpose.
func (c *cluster) supervise(slot string, p *proc) {
	defer c.wg.Done()
	for {
		<-p.Done()
		c.mu.Lock()
		stop := c.stopped[slot] || (p.termed && !p.restart)
		if !p.killed && !p.termed && !(c.tolerateExit != nil && c.tolerateExit(p)) {
			c.unexpected = append(c.unexpected, fmt.Sprintf("%s exited by itself with code %d after %s (log %s)",
				p.id, p.ExitCode(), p.Exited().Sub(p.Started()).Round(time.Millisecond), filepath.Base(p.logPath)))
		}
		c.mu.Unlock()
		if stop {
			return
		}
		if !p.killed && p.Exited().Sub(p.Started()) < time.Second {
			// Do not spin on a relay that cannot start: a supervisor's
			// restart backoff, as an orchestrator has.
			time.Sleep(200 * time.Millisecond)
		}
		np, err := c.launch(slot)
		if errors.Is(err, errStopped) {
			return
		}
		if err != nil {
			c.mu.Lock()
			c.unexpected = append(c.unexpected, fmt.Sprintf("restart %s: %v", slot, err))
			c.mu.Unlock()
			return
		}
		p = np
	}
}

// proc returns the current process of slot.
func (c *cluster) proc(slot string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current[slot]
}

// killAll SIGKILLs every running relay at once.
func (c *cluster) killAll() int {
	var wg sync.WaitGroup
	n := 0
	var mu sync.Mutex
	for _, s := range c.slots() {
		wg.Go(func() {
			if c.kill(s) != "" {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return n
}

// kill SIGKILLs the current process of slot; its supervisor starts a new
// one. It returns the id of the process killed, or "" when slot had no
// live process (it was being restarted or stopped).
func (c *cluster) kill(slot string) string {
	c.mu.Lock()
	p := c.current[slot]
	if p == nil || !p.Alive() || p.termed || p.killed {
		c.mu.Unlock()
		return ""
	}
	p.killed = true
	c.kills++
	c.mu.Unlock()
	_ = p.Signal(syscall.SIGKILL)
	<-p.Done()
	return p.id
}

// pause freezes slot's process with SIGSTOP for d (a GC pause, a frozen
// VM): its lease expires while its sessions stay open.
func (c *cluster) pause(ctx context.Context, slot string, d time.Duration) {
	c.mu.Lock()
	p := c.current[slot]
	if p == nil || !p.Alive() {
		c.mu.Unlock()
		return
	}
	c.pauses++
	c.mu.Unlock()
	_ = p.Signal(syscall.SIGSTOP)
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	if p.Alive() {
		_ = p.Signal(syscall.SIGCONT)
	}
}

// stop sends SIGTERM to slot's process and requires a clean exit (status
// 0) within the drain timeout plus exitSlack. It returns how long the
// process took.
func (c *cluster) stop(slot string) time.Duration {
	c.t.Helper()
	c.mu.Lock()
	c.stopped[slot] = true
	p := c.current[slot]
	if p != nil {
		p.termed = true
	}
	c.mu.Unlock()
	if p == nil || !p.Alive() {
		c.t.Errorf("relay %s is not running when asked to stop", slot)
		return 0
	}
	p.waitSignalable()
	start := time.Now()
	_ = p.Signal(syscall.SIGTERM)
	bound := drainTimeout + testkit.LoadScaled(exitSlack)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-p.Done():
	case <-t.C:
		c.t.Errorf("relay %s did not exit within %s of SIGTERM; killing it", p.id, bound.Round(time.Millisecond))
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		return time.Since(start)
	}
	took := time.Since(start)
	if p.ExitCode() != 0 {
		c.t.Errorf("relay %s exited with status %d after SIGTERM, want 0 (log %s)", p.id, p.ExitCode(), filepath.Base(p.logPath))
	}
	return took
}

// rollingRestart stops slot's process with SIGTERM, like a deploy would,
// and lets the supervisor start a new one. The process must exit 0 within
// the drain timeout plus exitSlack; it returns how long it took.
func (c *cluster) rollingRestart(slot string) (string, time.Duration, error) {
	c.mu.Lock()
	p := c.current[slot]
	if p == nil || !p.Alive() || p.killed || p.termed {
		c.mu.Unlock()
		return "", 0, nil
	}
	p.termed, p.restart = true, true
	c.mu.Unlock()
	p.waitSignalable()
	start := time.Now()
	_ = p.Signal(syscall.SIGTERM)
	bound := drainTimeout + testkit.LoadScaled(exitSlack)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-p.Done():
	case <-t.C:
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		return p.id, time.Since(start), fmt.Errorf("relay %s did not exit within %s of SIGTERM", p.id, bound.Round(time.Millisecond))
	}
	took := time.Since(start)
	if p.ExitCode() != 0 {
		return p.id, took, fmt.Errorf("relay %s exited with status %d after SIGTERM, want 0 (log %s)", p.id, p.ExitCode(), filepath.Base(p.logPath))
	}
	return p.id, took, nil
}

// waitSignalable waits until the relay process can catch SIGTERM: the Go
// runtime and the packages' initialization come first (0.3-0.5 s for this
// binary on a loaded 2-core machine), and a SIGTERM before that kills the
// process like SIGKILL, which the chaos covers with its kills. The relay's
// first log line says it is past that point (testkit.Relay.Spoke). A stop
// waits until then, so that exit 0 is what it checks.
// A relay silent for 30s is stopped anyway: the stop's checks report it.
func (p *proc) waitSignalable() {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-p.Spoke():
	case <-p.Done():
	case <-t.C:
	}
}

// stopAll stops every running slot concurrently and returns the longest
// time a relay took to exit.
func (c *cluster) stopAll() time.Duration {
	c.mu.Lock()
	var slots []string
	for slot, p := range c.current {
		if !c.stopped[slot] && p.Alive() {
			slots = append(slots, slot)
		}
	}
	c.mu.Unlock()
	var mu sync.Mutex
	var longest time.Duration
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Go(func() {
			d := c.stop(s)
			mu.Lock()
			longest = max(longest, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	return longest
}

// slots lists the slots that are running (not stopped on purpose).
func (c *cluster) slots() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for s := range c.current {
		if !c.stopped[s] {
			out = append(out, s)
		}
	}
	return out
}

func (c *cluster) unexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.unexpected...)
}

func (c *cluster) counts() (kills, pauses, started int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kills, c.pauses, len(c.all)
}

// cleanup kills whatever still runs and, when the test failed, prints the
// relays' log tails and every error they logged.
func (c *cluster) cleanup() {
	c.mu.Lock()
	for s := range c.current {
		c.stopped[s] = true
	}
	var live []*proc
	for _, p := range c.current {
		if p.Alive() {
			p.killed = true
			live = append(live, p)
		}
	}
	c.mu.Unlock()
	for _, p := range live {
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
	}
	c.wg.Wait()
	if !c.t.Failed() {
		return
	}
	c.mu.Lock()
	all := append([]*proc(nil), c.all...)
	current := map[*proc]bool{}
	for _, p := range c.current {
		current[p] = true
	}
	c.mu.Unlock()
	shown := 0
	for _, p := range all {
		switch {
		case current[p]:
		case !p.killed && !p.termed && shown < 5:
			shown++
		default:
			continue
		}
		c.t.Logf("tail of %s (exit %d):\n%s", p.id, p.ExitCode(), tailFile(p.logPath, 25))
	}
}

// loggedErrors returns the ERROR lines of every relay's log (at most 20):
// the relay logs at ERROR level only when it sees the contract broken.
func (c *cluster) loggedErrors() []string {
	c.mu.Lock()
	all := append([]*proc(nil), c.all...)
	c.mu.Unlock()
	var errs []string
	for _, p := range all {
		for _, l := range grepFile(p.logPath, "level=ERROR") {
			errs = append(errs, p.id+": "+l)
		}
	}
	if len(errs) > 20 {
		errs = append(errs[:20], fmt.Sprintf("… and %d more", len(errs)-20))
	}
	return errs
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func grepFile(path, substr string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}

var deliveredRe = regexp.MustCompile(`msg="relay stopped".* delivered=(\d+)`)

// deliveredBy reads the delivered count a relay logs when it stops.
func deliveredBy(p *proc) (int64, bool) {
	for _, l := range grepFile(p.logPath, "relay stopped") {
		if m := deliveredRe.FindStringSubmatch(l); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			return n, true
		}
	}
	return 0, false
}

// status runs `outbox-relay status --json`.
func (c *cluster) status(ctx context.Context) (operator.Status, error) {
	var st operator.Status
	cmd := exec.CommandContext(ctx, c.bin, "status", "--json", "--database-url", c.dbURL, "--schema", c.schema)
	cmd.Env = testkit.CleanEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return st, fmt.Errorf("outbox-relay status: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("outbox-relay status: bad JSON: %v", err)
	}
	return st, nil
}
