package redissink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			Why: map[string]string{"Partitions": "a Redis stream has no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t)
			var mu sync.Mutex
			var topics []string
			return &sinktest.Env{
				Sink: e.sink,
				Topic: func(suffix string) string {
					topic := e.topic(suffix)
					mu.Lock()
					topics = append(topics, topic)
					mu.Unlock()
					return topic
				},
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					var out []sinktest.Delivered
					for len(out) < n {
						mu.Lock()
						ts := append([]string(nil), topics...)
						mu.Unlock()
						for _, topic := range ts {
							rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
							ms, _ := e.read(rctx, topic, n-len(out))
							cancel()
							for _, m := range ms {
								out = append(out, delivered(topic, m))
							}
							if len(out) == n {
								break
							}
						}
						if err := ctx.Err(); err != nil {
							return out, fmt.Errorf("read %d of %d entries: %w", len(out), n, err)
						}
					}
					return out, nil
				},
				Poison: func(topic string) sinks.Message {
					// The entry goes to a key holding a string: WRONGTYPE.
					wrong := e.prefix + ":wrongtype:"
					require.NoError(t, e.rdb.Set(context.Background(), wrong+topic, "not a stream", 0).Err())
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": wrong}
					return m
				},
				// Connections cut and refused through the proxy: the shared
				// server is never stopped or reconfigured.
				BreakTransient: e.proxy.Break,
				Restart:        e.proxy.Restart,
				Down:           e.proxy.Down,
				Up:             e.proxy.Up,
			}
		},
	})
}

// TestEntryFields pins the entry layout: id, outbox-seq, key, payload, one
// field per header (sorted), in batch order.
func TestEntryFields(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Stream = "{topic}"; c.HeaderPrefix = "h-" }))
	ctx := context.Background()
	topic := e.topic("fields")
	m := sinktest.Msg(topic, "order-1", 1, []byte{0, 1, 0xff})
	m.Headers = map[string]string{"type": "OrderPlaced", "key": "a header named key"}
	keyless := sinktest.Msg(topic, "", 2, []byte("x"))
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{m, keyless}))
	res, err := e.rdb.Do(ctx, "XRANGE", topic, "-", "+").Slice()
	require.NoError(t, err)
	require.Len(t, res, 2)
	f0 := res[0].([]any)[1].([]any)
	require.Equal(t, []any{"id", m.ID, "outbox-seq", "1", "key", "order-1", "payload", "\x00\x01\xff", "h-key", "a header named key", "h-type", "OrderPlaced"}, f0)
	f1 := res[1].([]any)[1].([]any)
	require.Equal(t, []any{"id", keyless.ID, "outbox-seq", "2", "payload", "x"}, f1, "no key field without a key")
}

// TestWrongTypeIsPermanentAndBlocksItsKey: the server's refusal of one
// entry is dead-lettered with its reply; later entries of its key are not
// added; other keys are.
func TestWrongTypeIsPermanentAndBlocksItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Stream = "{topic}" }))
	ctx := context.Background()
	ok, bad := e.topic("ok"), e.topic("bad")
	require.NoError(t, e.rdb.Set(ctx, bad, "x", 0).Err())
	batch := []sinks.Message{
		sinktest.Msg(ok, "a", 1, []byte("1")),
		sinktest.Msg(bad, "b", 2, []byte("2")),
		sinktest.Msg(ok, "b", 3, []byte("3")),
		sinktest.Msg(ok, "", 4, []byte("4")),
		sinktest.Msg(bad, "", 5, []byte("5")),
	}
	err := e.sink.Send(ctx, batch)
	be := &sinks.BatchError{}
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.True(t, sinks.IsPermanent(be.Errs[1]), "%v", be.Errs[1])
	require.ErrorContains(t, be.Errs[1], "WRONGTYPE")
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	require.True(t, sinks.IsPermanent(be.Errs[4]))
	n, err := e.rdb.XLen(ctx, ok).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
}

// TestHeaderClashIsPermanent: a header named like an entry field would
// shadow it; it is refused, not silently dropped.
func TestHeaderClashIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, field := range []string{FieldPayload, FieldSeq} {
		m := sinktest.Msg(e.topic("clash"), "k", 1, []byte("x"))
		m.Headers = map[string]string{field: "forged"}
		err := e.sink.Send(context.Background(), []sinks.Message{m})
		require.True(t, sinks.IsPermanent(sinks.Outcome(err, 0, 1)), "%v", err)
		require.ErrorIs(t, sinks.Outcome(err, 0, 1), ErrFieldClash)
	}
}

// TestTrimming: maxlen keeps a stream near its length; max_age drops
// entries older than the age.
func TestTrimming(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, withConfig(func(c *Config) { c.Stream = "{topic}"; c.MaxLen = 10 }))
	topic := e.topic("maxlen")
	for range 30 {
		require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 100, 3, 8)))
	}
	n, err := e.rdb.XLen(ctx, topic).Result()
	require.NoError(t, err)
	require.Less(t, n, int64(300), "trimmed (approximately: whole macro nodes)")

	e2 := setup(t, withConfig(func(c *Config) { c.Stream = "{topic}"; c.MaxAge = time.Millisecond }))
	topic = e2.topic("maxage")
	// An entry dated an hour ago (explicit id) goes with the next add.
	old := fmt.Sprintf("%d-0", time.Now().Add(-time.Hour).UnixMilli())
	require.NoError(t, e2.rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, ID: old, Values: []any{"id", "old"}}).Err())
	for range 200 { // MINID ~ trims whole macro nodes: fill one past the old entry
		require.NoError(t, e2.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 8)))
	}
	first, err := e2.rdb.XRangeN(ctx, topic, "-", "+", 1).Result()
	require.NoError(t, err)
	require.NotEqual(t, old, first[0].ID, "the hour-old entry was trimmed")
}

// TestDisconnectedIsNotAttempted: a server that refuses connections costs
// no attempt; the sink delivers again once it is back.
func TestDisconnectedIsNotAttempted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	topic := e.topic("down")
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 1)))
	restore := e.proxy.Break()
	batch := sinktest.Batch(topic, 3, 2, 1)
	var err error
	for range 3 { // a pooled connection cut under a Send is an attempt
		if err = e.sink.Send(ctx, batch); sinks.Outcome(err, 0, 3) != nil && isNotAttempted(err, 3) {
			break
		}
	}
	require.True(t, isNotAttempted(err, 3), "%v", err)
	require.Error(t, e.sink.Healthy(ctx))
	restore()
	require.NoError(t, e.sink.Send(ctx, batch))
	require.NoError(t, e.sink.Healthy(ctx))
}

func isNotAttempted(err error, n int) bool {
	for i := range n {
		if !errors.Is(sinks.Outcome(err, i, n), sinks.ErrNotAttempted) {
			return false
		}
	}
	return true
}

func TestSlot(t *testing.T) {
	t.Parallel()
	// Values from the Redis Cluster specification's CRC16 (XMODEM).
	require.Equal(t, 12739, slot("123456789"))
	require.Equal(t, slot("user1000"), slot("{user1000}.following"))
	require.Equal(t, slot("foo"), slot("{foo}bar"))
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("rediss://u:p%40ss@h:6380/2?stream=ev:{topic}&maxlen=1000&tls_ca_file=/ca.pem")
	require.NoError(t, err)
	require.Equal(t, "ev:{topic}", c.Stream)
	require.Equal(t, 1000, c.MaxLen)
	srv, err := parseServer(c.URL, false)
	require.NoError(t, err)
	require.Equal(t, server{Scheme: "rediss", Addrs: []string{"h:6380"}, Username: "u", Password: "p@ss", DB: 2}, srv)
	require.NotContains(t, c.Redacted(), "p%40ss")
	c, err = ParseURL("rediss://h:6380?tls=true&tls_server_name=cache")
	require.NoError(t, err, "tls=true is redundant with rediss://, not wrong")
	require.Equal(t, TLSConfig{Enable: true, ServerName: "cache"}, c.TLS)
	c, err = ParseURL("redis://h1:7000,h2:7001?cluster=true")
	require.NoError(t, err)
	srv, err = parseServer(c.URL, true)
	require.NoError(t, err)
	require.Equal(t, []string{"h1:7000", "h2:7001"}, srv.Addrs)
	for raw, want := range map[string]string{
		"redis://h?bogus=1":               `unknown sink URL parameter "bogus"`,
		"redis://h?maxlen=10&max_age=1h":  "exclusive",
		"redis://h?stream={nope}":         "stream: unknown placeholder",
		"redis://h/x":                     "database must be a number",
		"redis://h1,h2":                   "cluster=true",
		"redis://h:0":                     "port must be between",
		"redis://h?tls_ca_file=/ca.pem":   "use rediss://",
		"redis://h?tls=true":              "use rediss://",
		"redis://h1,h2/3?cluster=true":    "only database 0",
		"redis://h?maxlen=-1":             "maxlen: must not be negative",
		"rediss://h?tls_cert_file=/c.pem": "cert_file and key_file",
		"http://h":                        "scheme must be redis or rediss",
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
	}
}

// The replies that say the server as a whole takes no writes, and a
// connection lost with the call on it, wrap sinks.ErrUnavailable; a
// failed dial is not sent; other refusals say nothing of the server.
func TestOutageClassification(t *testing.T) {
	t.Parallel()
	for _, msg := range []string{"LOADING Redis is loading the dataset in memory", "MASTERDOWN Link with MASTER is down",
		"CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request during rehashing of slot", "BUSY Redis is busy running a script",
		"NOREPLICAS Not enough good replicas to write", "OOM command not allowed when used memory > 'maxmemory'.",
		"READONLY You can't write against a read only replica.", "MISCONF Redis is configured to save RDB snapshots"} {
		err := replyErr("s", msg)
		require.ErrorIs(t, err, sinks.ErrUnavailable, msg)
		require.False(t, sinks.IsPermanent(err), msg)
	}
	for _, msg := range []string{"MOVED 3999 127.0.0.1:6381", "NOSCRIPT No matching script"} {
		err := replyErr("s", msg)
		require.NotErrorIs(t, err, sinks.ErrUnavailable, msg)
		require.False(t, sinks.IsPermanent(err), msg)
	}
	for _, msg := range []string{"WRONGTYPE Operation against a key holding the wrong kind of value", "ERR wrong number"} {
		require.NotErrorIs(t, replyErr("s", msg), sinks.ErrUnavailable, msg)
		require.True(t, sinks.IsPermanent(replyErr("s", msg)), msg)
	}
	s := &Sink{}
	require.ErrorIs(t, s.callErr(fmt.Errorf("read: %w", io.EOF)), sinks.ErrUnavailable)
	require.True(t, sinks.IsNotSent(s.callErr(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED})))
	require.NotErrorIs(t, s.callErr(context.Canceled), sinks.ErrUnavailable)
	require.False(t, sinks.IsNotSent(s.callErr(context.Canceled)))
}

// TestServerRefusalsAreUnavailable makes a throwaway server refuse every
// write in the three ways an operator meets most (out of memory under
// maxmemory, a replica, a failed save with stop-writes-on-bgsave-error)
// and checks that the sink reports each as the destination unavailable
// for every key of a batch, so that the relay's breaker opens instead of
// spending attempts; once the server takes writes again, the same batch
// is delivered. The shared server is never reconfigured.
func TestServerRefusalsAreUnavailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		reply string
		// refuse makes the server refuse writes and returns what undoes it.
		refuse func(t *testing.T, ctx context.Context, srv *throwaway.Server, rdb *redis.Client) (restore []any)
	}{
		{"OOM", func(t *testing.T, ctx context.Context, _ *throwaway.Server, rdb *redis.Client) []any {
			require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
			return []any{"CONFIG", "SET", "maxmemory", "0"}
		}},
		{"READONLY", func(t *testing.T, ctx context.Context, _ *throwaway.Server, rdb *redis.Client) []any {
			// A replica of a master that is not there (nothing listens on
			// port 1 of loopback): the server stays up, read only.
			require.NoError(t, rdb.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
			return []any{"REPLICAOF", "NO", "ONE"}
		}},
		{"MISCONF", func(t *testing.T, ctx context.Context, srv *throwaway.Server, rdb *redis.Client) []any {
			// A save point makes a failed save stop writes; the save
			// fails because the server's directory is gone (the
			// throwaway's own, and dir cannot be changed at run time).
			require.NoError(t, rdb.ConfigSet(ctx, "save", "3600 1").Err())
			require.NoError(t, os.RemoveAll(srv.Dir()))
			require.NoError(t, rdb.BgSave(ctx).Err())
			testkit.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
				info, err := rdb.Info(ctx, "persistence").Result()
				return err == nil && strings.Contains(info, "rdb_bgsave_in_progress:0") &&
					strings.Contains(info, "rdb_last_bgsave_status:err"), "waiting for the save to fail"
			})
			return []any{"CONFIG", "SET", "stop-writes-on-bgsave-error", "no"}
		}},
	} {
		t.Run(c.reply, func(t *testing.T) {
			t.Parallel()
			srv := throwaway.Redis(t)
			e := setup(t, onServer(srv.URL()))
			ctx := context.Background()
			topic := e.topic("refused")
			require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 1)), "before the refusal")
			restore := c.refuse(t, ctx, srv, e.rdb)

			batch := sinktest.Batch(topic, 4, 2, 1) // keys k0 and k1
			err := e.sink.Send(ctx, batch)
			for i := range batch {
				oe := sinks.Outcome(err, i, len(batch))
				if i >= 2 { // a later message of a refused key
					require.ErrorIs(t, oe, sinks.ErrNotAttempted)
					continue
				}
				require.ErrorIs(t, oe, sinks.ErrUnavailable, "message %d", i)
				require.ErrorContains(t, oe, c.reply, "message %d", i)
				require.False(t, sinks.IsPermanent(oe))
			}

			require.NoError(t, e.rdb.Do(ctx, restore...).Err())
			require.NoError(t, e.sink.Send(ctx, batch), "after the server takes writes again")
			_, err = e.read(ctx, topic, 5)
			require.NoError(t, err)
		})
	}
}
