// Package awsbatch holds what the Amazon SQS, SNS and Kinesis sinks
// share: the SQS and SNS message layout (body, the sink's own attributes,
// one attribute per header, FIFO group and deduplication ids) and the
// checks of what those services refuse for a message itself; for all
// three, the rounds in which a Send goes out as batch requests (of at most
// 10 entries for SQS and SNS, 500 records for Kinesis) that never hold
// two messages of one key, the reading of the services' answers (Service:
// which entry was accepted, which refusal is permanent), and the SDK
// configuration (region, credentials, endpoint override). It knows no AWS
// client: each sink turns an Entry into its own request type, sends it and
// hands the answer to Answer (or, for Kinesis' answer by position, to
// Service.Refusal).
package awsbatch

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// Limits of both services that the sinks check before sending.
const (
	// MaxAttributes is the number of message attributes a message may
	// carry (SQS's limit, which also bounds an SNS message delivered to an
	// SQS queue).
	MaxAttributes = 10
	// MaxEntries is the number of entries of one batch request.
	MaxEntries = 10
	// MaxGroupID is the length limit of a FIFO MessageGroupId.
	MaxGroupID = 128
)

// Attribute names the sinks set on every message, besides one per header.
const (
	AttrID  = wire.ID  // the message id (String)
	AttrSeq = wire.Seq // the message's position in the outbox (Number); per key, it only grows
	AttrKey = wire.Key // the outbox key (String), absent when the message has none
)

// Attr is one message attribute.
type Attr struct {
	Name, Type, Value string
}

// Entry is one message as a batch entry.
type Entry struct {
	I     int    // index in the Send's batch; also the entry id
	Dest  string // queue URL or topic ARN
	Body  string
	Attrs []Attr // the sink's own, then the headers by name
	// Group and Dedup are the FIFO MessageGroupId and
	// MessageDeduplicationId, "" for a standard queue or topic.
	Group, Dedup string
	// PartitionKey is a Kinesis record's partition key, "" for SQS and
	// SNS.
	PartitionKey string
	Size         int // body plus every attribute's name, type and value (Kinesis: data plus partition key)
}

// ID is the entry id of the batch request.
func (e *Entry) ID() string { return strconv.Itoa(e.I) }

// Layout says how messages become entries.
type Layout struct {
	// Service names the service in errors ("sqs", "sns").
	Service string
	// Invalid is wrapped by the error of a message the service could
	// never accept.
	Invalid error
	// Base64 encodes the payload in standard base64.
	Base64 bool
	// MaxBytes is the largest message, and the largest request.
	MaxBytes int
}

// Build returns m's entry for dest, or the reason the service could never
// accept it (wrapping l.Invalid). A destination ending in .fifo gets the
// FIFO fields: the key as group (a keyless message its id), the id as
// deduplication id.
func (l Layout) Build(i int, m sinks.Message, dest string) (*Entry, error) {
	if dest == "" {
		return nil, fmt.Errorf("%w: the destination template renders an empty string", l.Invalid)
	}
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%w: the payload is empty (%s refuses an empty message body)", l.Invalid, l.Service)
	}
	var body string
	if l.Base64 {
		body = base64.StdEncoding.EncodeToString(m.Payload)
	} else {
		if err := CheckText(m.Payload); err != nil {
			return nil, fmt.Errorf("%w: the payload %v (set body_encoding=base64 for binary payloads)", l.Invalid, err)
		}
		body = string(m.Payload)
	}
	n := 2 + len(m.Headers)
	if m.Key != "" {
		n++
	}
	// The relay's outbox-producer takes an attribute the application's
	// headers may already have taken all of: it stays behind then, rather
	// than refusing a message that fit before the relay named its
	// producer (a consumer then orders it with the unnamed producer's).
	_, producer := m.Headers[sinks.HeaderProducer]
	skipProducer := producer && n > MaxAttributes
	if skipProducer {
		n--
	}
	if n > MaxAttributes {
		return nil, fmt.Errorf("%w: %d headers, and a message takes %d attributes of which the sink uses %d (%s, %s, %s)",
			l.Invalid, len(m.Headers), MaxAttributes, n-len(m.Headers), AttrID, AttrSeq, AttrKey)
	}
	e := &Entry{I: i, Dest: dest, Body: body, Attrs: make([]Attr, 0, n), Size: len(body)}
	add := func(name, typ, v string) {
		e.Attrs = append(e.Attrs, Attr{Name: name, Type: typ, Value: v})
		e.Size += len(name) + len(typ) + len(v)
	}
	add(AttrID, "String", m.ID)
	add(AttrSeq, "Number", strconv.FormatInt(m.Seq, 10))
	if m.Key != "" {
		if err := CheckText([]byte(m.Key)); err != nil {
			return nil, fmt.Errorf("%w: the key %v", l.Invalid, err)
		}
		add(AttrKey, "String", m.Key)
	}
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // the same error for the same message
	for _, k := range names {
		v := m.Headers[k]
		if skipProducer && k == sinks.HeaderProducer {
			continue
		}
		if err := CheckAttrName(k); err != nil {
			return nil, fmt.Errorf("%w: header %q: %v", l.Invalid, k, err)
		}
		if v == "" {
			return nil, fmt.Errorf("%w: header %q: the value is empty (%s refuses an empty attribute value)", l.Invalid, k, l.Service)
		}
		if err := CheckText([]byte(v)); err != nil {
			return nil, fmt.Errorf("%w: header %q: the value %v", l.Invalid, k, err)
		}
		add(k, "String", v)
	}
	if e.Size > l.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes with its attributes, above max_message_bytes (%d)", l.Invalid, e.Size, l.MaxBytes)
	}
	if strings.HasSuffix(dest, ".fifo") {
		group := m.Key
		if group == "" {
			group = m.ID // keyless messages are not ordered: spread them
		}
		if len(group) > MaxGroupID {
			return nil, fmt.Errorf("%w: the key is %d bytes, and a FIFO MessageGroupId takes at most %d", l.Invalid, len(group), MaxGroupID)
		}
		if err := checkGroupChars(group); err != nil {
			return nil, fmt.Errorf("%w: the key %v, as a FIFO MessageGroupId", l.Invalid, err)
		}
		e.Group, e.Dedup = group, m.ID
	}
	return e, nil
}

// Plan says how one Send goes out.
type Plan struct {
	// Build returns message i's entry, or why it can never be accepted
	// (reported Permanent).
	Build func(i int, m sinks.Message) (*Entry, error)
	// Send sends one request (entries of one destination, no two of one
	// key) and returns each entry's error, nil when accepted, in order.
	Send func(ctx context.Context, req []*Entry) []error
	// MaxBytes bounds the sum of the entries' sizes in one request.
	MaxBytes int
	// MaxEntries bounds the entries of one request; 0 means MaxEntries
	// (SQS's and SNS's 10).
	MaxEntries int
	// Concurrency is the number of requests in flight.
	Concurrency int
}

// Run sends msgs by p in rounds: each round holds each key's next message
// and every keyless message left, packed per destination into requests of
// at most p.MaxEntries (default MaxEntries) and MaxBytes, sent Concurrency at a time. A key whose
// message failed (or could not be built) has its later messages reported
// sinks.ErrNotAttempted. ctx ending between rounds fails what is left.
// errPrefix starts the context error ("outbox: sqs").
func (p Plan) Run(ctx context.Context, msgs []sinks.Message, errPrefix string) error {
	be := sinks.NewBatchError(len(msgs))
	var gate sinks.KeyGate
	entries := make([]*Entry, len(msgs))
	left := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if gate.Blocked(m) {
			be.Errs[i] = sinks.ErrNotAttempted
			continue
		}
		e, err := p.Build(i, m)
		if err != nil {
			be.Errs[i] = sinks.Permanent(err)
			gate.Fail(m)
			continue
		}
		entries[i] = e
		left = append(left, i)
	}
	for len(left) > 0 {
		if err := ctx.Err(); err != nil {
			for _, i := range left {
				be.Errs[i] = fmt.Errorf("%s: %w", errPrefix, err)
			}
			break
		}
		var round, rest []int
		taken := map[string]bool{}
		for _, i := range left {
			m := msgs[i]
			switch {
			case gate.Blocked(m):
				be.Errs[i] = sinks.ErrNotAttempted
			case m.Key != "" && taken[m.Key]:
				rest = append(rest, i)
			default:
				if m.Key != "" {
					taken[m.Key] = true
				}
				round = append(round, i)
			}
		}
		p.round(ctx, round, entries, be)
		for _, i := range round {
			if be.Errs[i] != nil {
				gate.Fail(msgs[i])
			}
		}
		left = rest
	}
	return be.Err()
}

// round sends the entries at idx (no two of one key) and records each
// outcome in be.
func (p Plan) round(ctx context.Context, idx []int, entries []*Entry, be *sinks.BatchError) {
	most := p.MaxEntries
	if most <= 0 {
		most = MaxEntries
	}
	var reqs [][]*Entry
	open := map[string]int{} // destination -> its request being filled
	size := map[string]int{}
	for _, i := range idx {
		e := entries[i]
		r, ok := open[e.Dest]
		if !ok || len(reqs[r]) == most || size[e.Dest]+e.Size > p.MaxBytes {
			reqs = append(reqs, nil)
			r = len(reqs) - 1
			open[e.Dest] = r
			size[e.Dest] = 0
		}
		reqs[r] = append(reqs[r], e)
		size[e.Dest] += e.Size
	}
	record := func(req []*Entry) {
		errs := p.Send(ctx, req)
		for j, e := range req {
			be.Errs[e.I] = errs[j] // each request writes only its own entries' slots
		}
	}
	if len(reqs) == 1 {
		record(reqs[0])
		return
	}
	sem := make(chan struct{}, max(1, p.Concurrency))
	var wg sync.WaitGroup
	for _, req := range reqs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			record(req)
		}()
	}
	wg.Wait()
}

// CheckText reports a byte string the services do not take as text: it
// must be UTF-8 of the characters #x9, #xA, #xD, #x20 to #xD7FF, #xE000
// to #xFFFD and #x10000 to #x10FFFF.
func CheckText(b []byte) error {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("is not valid UTF-8 (byte %d)", i)
		}
		if !(r == 0x9 || r == 0xA || r == 0xD || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF) {
			return fmt.Errorf("has character %U at byte %d, which SQS and SNS do not take", r, i)
		}
		i += n
	}
	return nil
}

// CheckAttrName reports a name the services refuse as a message
// attribute name: 1 to 256 of A-Z, a-z, 0-9, '_', '-', '.'; no leading,
// trailing or doubled '.'; not starting with "AWS." or "Amazon." (any
// case); not one of the sinks' own attributes.
func CheckAttrName(name string) error {
	switch {
	case name == AttrID || name == AttrSeq || name == AttrKey:
		return fmt.Errorf("is one of the sink's own attributes (%s, %s, %s)", AttrID, AttrSeq, AttrKey)
	case name == "" || len(name) > 256:
		return errors.New("an attribute name has 1 to 256 characters")
	case name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, ".."):
		return errors.New("an attribute name cannot start or end with '.' or hold '..'")
	}
	if l := strings.ToLower(name); strings.HasPrefix(l, "aws.") || strings.HasPrefix(l, "amazon.") {
		return errors.New(`an attribute name cannot start with "AWS." or "Amazon."`)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("an attribute name holds only A-Z, a-z, 0-9, '_', '-' and '.', not %q", r)
		}
	}
	return nil
}

// checkGroupChars reports a MessageGroupId character the services refuse:
// they take printable ASCII (! to ~).
func checkGroupChars(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return fmt.Errorf("has byte %#x at %d, and a MessageGroupId holds only printable ASCII", s[i], i)
		}
	}
	return nil
}

// TransportErr classifies a request's failure that is not an answer of
// the service: a failed dial or name lookup as not sent (sinks.NotSent);
// the caller's context ended as a plain retriable error; anything else (a
// connection lost mid-request, no answer within the SDK's timeout) as the
// service unavailable (sinks.Unavailable, retriable: the request may have
// arrived). errPrefix starts the message ("outbox: sqs").
func TransportErr(errPrefix string, err error) error {
	err = fmt.Errorf("%s: %w", errPrefix, err)
	switch {
	case sinks.Unreached(err):
		return sinks.NotSent(err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return sinks.Unavailable(err)
}
