package testkit

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// CI reports whether the tests run under CI=true, where a missing service
// or tool fails a test instead of skipping it. Any other value, "1"
// included, is not CI.
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails tb under CI=true and skips it otherwise; what names
// the kind of thing missing ("service", "tool") and the format the reason.
func Unavailable(tb testing.TB, what, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		tb.Fatalf("required %s unavailable (CI=true): %s", what, msg)
	}
	tb.Skipf("skipping, %s unavailable (set CI=true to fail instead): %s", what, msg)
}

// Eventually polls cond every interval until it reports true, failing tb
// with cond's last explanation once timeout has passed.
func Eventually(tb testing.TB, timeout, interval time.Duration, cond func() (bool, string)) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var why string
	if !Poll(ctx, interval, func() bool {
		var ok bool
		ok, why = cond()
		return ok
	}) {
		tb.Fatalf("condition not met within %s: %s", timeout, why)
	}
}

// Poll checks cond at once and then every interval until it reports true
// (Poll returns true) or ctx ends (Poll returns false). It suits a
// goroutine, which must not fail the test itself, and code without a
// testing.TB.
func Poll(ctx context.Context, interval time.Duration, cond func() bool) bool {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-t.C:
		}
	}
}

// The shared services' default URLs, used when the TEST_*_URL variable is
// unset (the Makefile exports the same values).
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// DatabaseURL is TEST_DATABASE_URL, or DefaultDatabaseURL.
func DatabaseURL() string { return serviceURL("TEST_DATABASE_URL", DefaultDatabaseURL) }

// AMQPURL is TEST_AMQP_URL, or DefaultAMQPURL.
func AMQPURL() string { return serviceURL("TEST_AMQP_URL", DefaultAMQPURL) }

// NATSURL is TEST_NATS_URL, or DefaultNATSURL.
func NATSURL() string { return serviceURL("TEST_NATS_URL", DefaultNATSURL) }

// RedisURL is TEST_REDIS_URL, or DefaultRedisURL.
func RedisURL() string { return serviceURL("TEST_REDIS_URL", DefaultRedisURL) }

func serviceURL(env, def string) string {
	if u := os.Getenv(env); u != "" {
		return u
	}
	return def
}
