package throwaway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Mosquitto starts mosquitto (an MQTT 5 broker) on a free loopback port,
// anonymous clients allowed, with a Maximum Packet Size of 2 MiB (sent in
// the CONNACK) and no persistence. extra lines are added to its
// configuration file (an acl_file, persistence settings); the broker's
// directory is Dir, for files they name.
func Mosquitto(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	s := newServer(tb, "mosquitto")
	s.name = "mosquitto"
	conf := []string{
		fmt.Sprintf("listener %d 127.0.0.1", s.port),
		"allow_anonymous true",
		"max_packet_size 2097152",
		"log_dest stdout",
	}
	hasPersistence := false
	for _, l := range extra {
		if strings.HasPrefix(strings.TrimSpace(l), "persistence ") {
			hasPersistence = true
		}
	}
	if !hasPersistence {
		conf = append(conf, "persistence false")
	}
	if os.Geteuid() == 0 {
		// Run as root, mosquitto drops to the user "mosquitto", which
		// cannot read the test's temporary directory.
		conf = append(conf, "user root")
	}
	conf = append(conf, extra...)
	path := filepath.Join(s.dir, "mosquitto.conf")
	if err := os.WriteFile(path, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		tb.Fatalf("throwaway: %v", err)
	}
	s.args = []string{"-c", path}
	s.Start()
	return s
}

// Dir is the server's own temporary directory.
func (s *Server) Dir() string { return s.dir }

// Stop stops the server the polite way (SIGTERM: mosquitto writes its
// persistence file) and waits for it to exit. It is a no-op when the
// server is not running.
func (s *Server) Stop() {
	s.end(syscall.SIGTERM)
}
