package cli

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// The daemon's garbage collector. A relay's live heap is small (the
// batches in flight, a few MB at the defaults) and it allocates a batch's
// worth of rows at every claim, so at Go's default GOGC=100 it collected
// every 10 ms of a drain: the collector was a quarter of the relay's CPU,
// on the cores the database needs. At 400 the relay's CPU per message
// fell by a third and a 200k discard drain went 10–16 % faster; peak RSS
// went from 35 to 47 MB (docs/benchmarks.md, "The relay's garbage collector").
const (
	gcPercent = 400
	// gcLimitDefault is the soft memory limit when no cgroup sets one: a
	// heap allowed to grow to five times the batches in flight collects
	// more often as it nears this, so large payloads do not multiply
	// the footprint by five.
	gcLimitDefault = 256 << 20
)

// TuneGC sets the collector of the outbox-relay process: GOGC 400 and a
// soft memory limit (three quarters of the cgroup's memory limit, or 256
// MiB without one), unless GOGC or GOMEMLIMIT is set, which then rule
// alone, as the Go runtime reads them.
func TuneGC() {
	percent, limit, ok := gcSettings(os.Getenv, cgroupMemoryLimit)
	if !ok {
		return
	}
	debug.SetGCPercent(percent)
	debug.SetMemoryLimit(limit)
}

// gcSettings decides TuneGC's settings; ok is false when the environment
// sets the collector itself.
func gcSettings(getenv func(string) string, cgroupLimit func() int64) (percent int, limit int64, ok bool) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return 0, 0, false
	}
	limit = gcLimitDefault
	if c := cgroupLimit(); c > 0 {
		limit = c / 4 * 3
	}
	return gcPercent, limit, true
}

// cgroupMemoryLimit returns the memory limit of the process's cgroup (v2,
// then v1), or 0 when there is none or it cannot be read.
func cgroupMemoryLimit() int64 {
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := os.ReadFile(f); err == nil {
			return parseCgroupLimit(string(b))
		}
	}
	return 0
}

// parseCgroupLimit reads a cgroup memory limit file: "max" (v2) or a
// number near 2^63 (v1) mean no limit.
func parseCgroupLimit(s string) int64 {
	s = strings.TrimSpace(s)
	if s == "" || s == "max" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 {
		return 0
	}
	return n
}
