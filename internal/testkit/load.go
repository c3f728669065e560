package testkit

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// LoadScaled returns d stretched by how loaded the machine is: d ×
// max(1, the load average of the last minute / the CPUs). A deadline
// that bounds work rather than measures it (a process's exit after its
// drain, a page's load) uses it, so that a machine running twenty other
// processes does not fail a test whose subject is not time. Where the
// load cannot be read (not Linux), d.
func LoadScaled(d time.Duration) time.Duration {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return d
	}
	first, _, _ := strings.Cut(string(raw), " ")
	load, err := strconv.ParseFloat(first, 64)
	if err != nil {
		return d
	}
	return time.Duration(float64(d) * max(1, load/float64(runtime.NumCPU())))
}
