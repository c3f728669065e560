package throwaway

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// GoAWS is a test's own goaws (an SQS and SNS server) on a free loopback
// port: the goawsd command beside this file, built with the go tool on
// first use. goaws keeps everything in memory, so it does not restart:
// Stop makes it refuse connections and Start makes it listen again, with
// its queues and messages kept.
type GoAWS struct {
	tb   testing.TB
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Account is the account id in goaws' queue URLs and ARNs.
const Account = "100010001000"

var goawsBuild struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// goawsdBinary builds goawsd once per process into the temporary
// directory, under a name that changes with its sources, so that later
// test runs reuse it.
func goawsdBinary() (string, []byte, error) {
	goawsBuild.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "goawsd")
		h := sha256.New()
		files, _ := filepath.Glob(filepath.Join(src, "*.go"))
		for _, f := range append(files, filepath.Join(src, "go.mod"), filepath.Join(src, "go.sum")) {
			b, err := os.ReadFile(f)
			if err != nil {
				goawsBuild.err = err
				return
			}
			h.Write(b)
		}
		bin := filepath.Join(os.TempDir(), "outbox-relay-goawsd-"+hex.EncodeToString(h.Sum(nil))[:16])
		if _, err := os.Stat(bin); err == nil {
			goawsBuild.bin = bin
			return
		}
		tmp := bin + "." + strconv.Itoa(os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, ".")
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			goawsBuild.err, goawsBuild.out = err, out
			return
		}
		goawsBuild.bin, goawsBuild.err = bin, os.Rename(tmp, bin)
	})
	return goawsBuild.bin, goawsBuild.out, goawsBuild.err
}

// StartGoAWS starts goaws on a free port; it is killed when the test ends.
func StartGoAWS(tb testing.TB) *GoAWS {
	tb.Helper()
	bin, out, err := goawsdBinary()
	if err != nil {
		testkit.Unavailable(tb, "tool", "building goawsd (internal/testkit/throwaway/goawsd; scripts/services.sh downloads its modules): %v: %s", err, out)
	}
	g := &GoAWS{tb: tb, port: freePort(tb)}
	g.cmd = exec.Command(bin, "-port", strconv.Itoa(g.port), "-account", Account)
	g.cmd.Stderr = os.Stderr
	if err := g.cmd.Start(); err != nil {
		tb.Fatalf("throwaway: start goawsd: %v", err)
	}
	g.done = make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	tb.Cleanup(func() { _ = g.cmd.Process.Kill(); <-g.done })
	g.wait(true)
	return g
}

// Endpoint is the server's URL (http://127.0.0.1:port), for the SDK's
// endpoint override.
func (g *GoAWS) Endpoint() string { return "http://" + g.Addr() }

// Addr is the server's host:port.
func (g *GoAWS) Addr() string { return "127.0.0.1:" + strconv.Itoa(g.port) }

// QueueURL is the URL goaws gives the queue named name.
func (g *GoAWS) QueueURL(name string) string { return g.Endpoint() + "/" + Account + "/" + name }

// TopicARN is the ARN goaws gives the SNS topic named name (goaws leaves
// the region out).
func (g *GoAWS) TopicARN(name string) string { return "arn:aws:sns::" + Account + ":" + name }

// Stop closes the listener and every connection: clients are refused
// until Start.
func (g *GoAWS) Stop() {
	g.tb.Helper()
	_ = g.cmd.Process.Signal(syscall.SIGUSR1)
	g.wait(false)
}

// Start listens again on the same port.
func (g *GoAWS) Start() {
	g.tb.Helper()
	_ = g.cmd.Process.Signal(syscall.SIGUSR2)
	g.wait(true)
}

// wait polls the port until it accepts (up) or refuses connections.
func (g *GoAWS) wait(up bool) {
	g.tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", g.Addr(), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		if (err == nil) == up {
			return
		}
		select {
		case <-g.done:
			g.tb.Fatalf("throwaway: goawsd exited")
		default:
		}
		if time.Now().After(deadline) {
			g.tb.Fatalf("throwaway: goawsd on %s not %s after 15s", g.Addr(), map[bool]string{true: "accepting", false: "refusing"}[up])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
