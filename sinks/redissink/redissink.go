// Package redissink appends outbox messages to Redis Streams.
//
// Each message becomes one stream entry (XADD with an automatic entry id)
// with the fields id (the message id), outbox-seq (its position), key (the
// outbox key, absent when there is none), payload (byte for byte) and one
// field per header, named after it (with an optional prefix). The stream key is the topic, or a
// template.
//
// One round trip per batch. The whole batch goes to the server as one
// Lua script call (EVALSHA, the script cached by the server), which runs
// the XADDs in batch order and answers with one result per entry. The
// script also keeps per-key order: once an entry of a key fails (WRONGTYPE,
// OOM, ...), the later entries of that key in the batch are not added,
// so a later message of a key is never stored before an earlier one that
// failed. A script runs atomically, so no other client's command comes
// between the entries of one batch either.
//
// Redis Cluster: with cluster=true the sink uses go-redis' cluster client;
// a script may only touch keys of one hash slot, so a batch is cut into
// runs of consecutive messages whose stream keys share a slot (one run,
// and one round trip, when every message goes to the same stream), sent
// one after the other, each told which keys already failed.
//
// Redis has no server-side deduplication: delivery is at least once, and
// consumers drop duplicates by the id field, which is the same on every
// attempt.
package redissink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

var (
	// ErrReply is wrapped by the error of an entry the server refused; the
	// error text is the server's reply.
	ErrReply = errors.New("outbox: redis")
	// ErrFieldClash is wrapped by the (permanent) error of a message with
	// a header whose field name is id, key or payload.
	ErrFieldClash = errors.New("outbox: redis: header clashes with an entry field")
)

// xaddScript adds the entries of a batch in order. KEYS[i] is the stream
// of entry i. ARGV: the trimming ("" none, "MAXLEN" with a count, "MINID"
// with an age in ms), the number of keys already failed, those keys, then
// per entry: its outbox key, its number of fields, the fields and values.
// It answers per entry: the entry id, "!" and the error reply, or "" when
// the entry was not attempted because an earlier entry of its key failed.
const xaddScript = `
local trim, trimarg = ARGV[1], ARGV[2]
local failed = {}
local nfailed = tonumber(ARGV[3])
local a = 4
for i = 1, nfailed do failed[ARGV[a]] = true; a = a + 1 end
-- One argument table for every XADD: the command, the stream, the
-- trimming and '*' stay; the fields are written from base on and the
-- tail of a longer earlier entry is cleared.
local args = {'XADD', false}
local base = 3
if trim == 'MAXLEN' then
  args[3] = 'MAXLEN'; args[4] = '~'; args[5] = trimarg; base = 6
elseif trim == 'MINID' then
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(trimarg)
  if ms < 0 then ms = 0 end
  args[3] = 'MINID'; args[4] = '~'; args[5] = string.format('%.0f', ms); base = 6
end
args[base] = '*'
local top = base
local out = {}
for i = 1, #KEYS do
  local okey = ARGV[a]
  local nf = 2 * tonumber(ARGV[a + 1])
  a = a + 2
  if okey ~= '' and failed[okey] then
    out[i] = ''
  else
    args[2] = KEYS[i]
    for j = 1, nf do args[base + j] = ARGV[a + j - 1] end
    for j = base + nf + 1, top do args[j] = nil end
    top = base + nf
    local r = redis.pcall(unpack(args, 1, top))
    if type(r) == 'table' and r.err then
      out[i] = '!' .. r.err
      if okey ~= '' then failed[okey] = true end
    else
      out[i] = r
    end
  end
  a = a + nf
end
return out
`

var script = redis.NewScript(xaddScript)

// client is what the sink needs of go-redis' single-node and cluster
// clients.
type client interface {
	redis.Scripter
	Ping(ctx context.Context) *redis.StatusCmd
	Close() error
}

// Sink appends to Redis Streams. It implements sinks.Sink and
// sinks.HealthChecker and is safe for concurrent use.
type Sink struct {
	cfg      Config
	stream   sinkconf.Template
	c        client
	cluster  bool
	log      *slog.Logger
	inflight sinks.Inflight
}

// New returns a sink for cfg. It validates cfg and applies the defaults;
// it does not connect (the first Send does). logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	stream, err := sinkconf.ParseTemplate(cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("outbox: redis: stream: %w", err)
	}
	srv, err := parseServer(cfg.URL, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("outbox: redis: url: %w", err)
	}
	tc, err := cfg.tlsConfig(srv)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sink{cfg: cfg, stream: stream, cluster: cfg.Cluster, log: logger.With("sink", "redis")}
	// No retries inside go-redis: a script resent after a lost answer
	// would add its entries twice. The relay retries, with backoff kept
	// in the row.
	if cfg.Cluster {
		s.c = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: srv.Addrs, Username: srv.Username, Password: srv.Password,
			ClientName: cfg.ClientName, DialTimeout: cfg.DialTimeout, TLSConfig: tc,
			MaxRetries: -1, MaxRedirects: 3, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	} else {
		s.c = redis.NewClient(&redis.Options{
			Addr: srv.Addrs[0], Username: srv.Username, Password: srv.Password, DB: srv.DB,
			ClientName: cfg.ClientName, DialTimeout: cfg.DialTimeout, TLSConfig: tc,
			MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	}
	return s, nil
}

// Healthy pings the server.
func (s *Sink) Healthy(ctx context.Context) error {
	if err := s.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("outbox: redis: ping: %w", err)
	}
	return nil
}

// Close refuses new Sends, waits for in-flight ones or ctx, then closes
// the connections. It is idempotent.
func (s *Sink) Close(ctx context.Context) error {
	err := s.inflight.Close(ctx)
	if cerr := s.c.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
		s.log.Debug("redis close", "err", cerr)
	}
	if err != nil {
		return fmt.Errorf("outbox: redis: close: in-flight sends still running: %w", err)
	}
	return nil
}

// Send appends msgs in one script call per run (one per batch outside a
// cluster). See sinks.Sink for the contract.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	return s.inflight.GuardTimed(ctx, msgs, "outbox: redis", s.cfg.PublishTimeout, s.send)
}

// send is Send after its guard (sinks.Inflight.Guard).
func (s *Sink) send(ctx context.Context, msgs []sinks.Message) error {
	be := sinks.NewBatchError(len(msgs))
	streams := make([]string, len(msgs))
	var gate sinks.KeyGate
	todo := make([]int, 0, len(msgs))
	for i, m := range msgs {
		streams[i] = s.stream.Render(m.Topic, m.Key, m.Headers)
		err := s.check(m, streams[i])
		switch {
		case gate.Blocked(m):
			be.Errs[i] = sinks.ErrNotAttempted
		case err != nil:
			be.Errs[i] = sinks.Permanent(err)
			gate.Fail(m)
		default:
			todo = append(todo, i)
		}
	}
	// Runs of consecutive messages that one script call may take: the
	// whole batch, or in a cluster the messages whose streams share a slot.
	if !s.cluster && len(todo) == len(msgs) {
		// The common case: one run, every message, nothing failed yet.
		s.run(ctx, msgs, streams, todo, nil, be, &gate)
		return be.Err()
	}
	var runs [][]int
	for _, i := range todo {
		if n := len(runs); n > 0 && (!s.cluster || slot(streams[runs[n-1][0]]) == slot(streams[i])) {
			runs[n-1] = append(runs[n-1], i)
		} else {
			runs = append(runs, []int{i})
		}
	}
	for _, run := range runs {
		var failedKeys []string
		var keep []int
		for _, i := range run {
			if gate.Blocked(msgs[i]) {
				be.Errs[i] = sinks.ErrNotAttempted
				continue
			}
			keep = append(keep, i)
		}
		for _, i := range todo {
			if msgs[i].Key != "" && gate.Blocked(msgs[i]) && !slices.Contains(failedKeys, msgs[i].Key) {
				failedKeys = append(failedKeys, msgs[i].Key)
			}
		}
		if len(keep) == 0 {
			continue
		}
		s.run(ctx, msgs, streams, keep, failedKeys, be, &gate)
	}
	return be.Err()
}

// run sends the messages at idx in one script call and records each
// outcome.
func (s *Sink) run(ctx context.Context, msgs []sinks.Message, streams []string, idx []int, failedKeys []string, be *sinks.BatchError, gate *sinks.KeyGate) {
	keys := make([]string, len(idx))
	n := 3 + len(failedKeys)
	for _, i := range idx {
		n += 10 + 2*len(msgs[i].Headers)
	}
	args := make([]any, 0, n)
	switch {
	case s.cfg.MaxLen > 0:
		args = append(args, "MAXLEN", strconv.Itoa(s.cfg.MaxLen))
	case s.cfg.MaxAge > 0:
		args = append(args, "MINID", strconv.FormatInt(s.cfg.MaxAge.Milliseconds(), 10))
	default:
		args = append(args, "", "")
	}
	args = append(args, len(failedKeys))
	for _, k := range failedKeys {
		args = append(args, k)
	}
	var names []string
	for j, i := range idx {
		keys[j] = streams[i]
		args, names = s.appendEntry(args, msgs[i], names)
	}
	res, err := script.Run(ctx, s.c, keys, args...).StringSlice()
	if err == nil && len(res) != len(idx) {
		err = fmt.Errorf("outbox: redis: the script answered %d results for %d entries", len(res), len(idx))
	}
	if err != nil {
		err = s.callErr(err)
		for _, i := range idx {
			if gate.Blocked(msgs[i]) {
				be.Errs[i] = sinks.ErrNotAttempted
				continue
			}
			be.Errs[i] = err
			gate.Fail(msgs[i])
		}
		return
	}
	for j, i := range idx {
		switch r := res[j]; {
		case r == "":
			be.Errs[i] = sinks.ErrNotAttempted
		case strings.HasPrefix(r, "!"):
			be.Errs[i] = replyErr(streams[i], r[1:])
			gate.Fail(msgs[i])
		}
	}
}

// check refuses a message whose entry cannot be written.
func (s *Sink) check(m sinks.Message, stream string) error {
	if stream == "" {
		return errors.New("outbox: redis: stream: the template renders an empty stream key")
	}
	for k := range m.Headers {
		if name := s.cfg.HeaderPrefix + k; name == FieldID || name == FieldKey || name == FieldPayload || name == FieldSeq {
			return fmt.Errorf("%w: header %q would be field %q (set header_prefix)", ErrFieldClash, k, name)
		}
	}
	return nil
}

// appendEntry appends the script arguments of m's entry (its outbox key,
// its number of fields, then the field-value pairs: id, outbox-seq, key,
// payload and the headers by name) to args. names is scratch space, returned for
// reuse.
func (s *Sink) appendEntry(args []any, m sinks.Message, names []string) ([]any, []string) {
	nf := 3 + len(m.Headers)
	if m.Key != "" {
		nf++
	}
	args = append(args, m.Key, nf, FieldID, m.ID, FieldSeq, strconv.FormatInt(m.Seq, 10))
	if m.Key != "" {
		args = append(args, FieldKey, m.Key)
	}
	args = append(args, FieldPayload, m.Payload)
	if len(m.Headers) == 0 {
		return args, names
	}
	names = names[:0]
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		name := k
		if s.cfg.HeaderPrefix != "" {
			name = s.cfg.HeaderPrefix + k
		}
		args = append(args, name, m.Headers[k])
	}
	return args, names
}

// retriableReplies are the error reply prefixes of the other transient
// refusals (a cluster redirect, a script the server no longer holds);
// with unavailableReplies they are retried, and every other refusal of an
// entry is permanent.
var retriableReplies = []string{"MOVED", "ASK", "NOSCRIPT"}

func retriableReply(msg string) bool {
	code, _, _ := strings.Cut(msg, " ")
	return slices.Contains(retriableReplies, code)
}

// unavailableReplies are the error reply prefixes that say the server
// (or the cluster) as a whole takes no writes now, whatever the entry:
// out of memory under maxmemory (OOM), a replica (READONLY: the URL
// names a replica, or a failover demoted the server), a failed save with
// stop-writes-on-bgsave-error or a failed AOF write (MISCONF), loading
// its data set, a replica whose master is down, a cluster that is down or
// resharding, a script blocking the server, too few replicas for
// min-replicas-to-write. They wrap sinks.ErrUnavailable.
var unavailableReplies = []string{"OOM", "READONLY", "MISCONF", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "NOREPLICAS"}

func unavailableReply(msg string) bool {
	code, _, _ := strings.Cut(msg, " ")
	return slices.Contains(unavailableReplies, code)
}

// replyErr classifies the server's refusal of one entry.
func replyErr(stream, msg string) error {
	err := fmt.Errorf("%w: XADD %q: %s", ErrReply, stream, msg)
	switch {
	case unavailableReply(msg):
		return sinks.Unavailable(err)
	case retriableReply(msg):
		return err
	}
	return sinks.Permanent(err)
}

// callErr classifies the failure of a whole script call: retriable (a
// reply refusing the call cannot be pinned on one entry, and the relay's
// max attempts bound it; a lost
// connection may have added some entries, which the relay adds again
// under the same id). A failed dial sent nothing (sinks.NotSent); a
// connection lost or silent with the call on it, and the replies of
// unavailableReplies, say the server is unavailable (sinks.Unavailable).
func (s *Sink) callErr(err error) error {
	e := fmt.Errorf("outbox: redis: %w", err)
	var reply redis.Error
	switch {
	case sinks.Unreached(err) || errors.Is(err, redis.ErrPoolTimeout):
		return sinks.NotSent(e)
	case errors.As(err, &reply):
		if unavailableReply(reply.Error()) {
			return sinks.Unavailable(e)
		}
		return e
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrClosed):
		return e
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), isTimeout(err):
		return sinks.Unavailable(e)
	}
	return e
}

// isTimeout reports a network timeout (no answer within read_timeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// slot is the Redis Cluster hash slot of key (CRC16 of the key or of its
// {hash tag}, mod 16384).
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
