package console

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// History is how far back the sparklines look.
const History = time.Hour

// Sampler keeps the per-topic backlog of the last hour in memory, one
// sample every interval, for the overview's sparklines. Each relay
// process samples on its own: the history starts when the process does.
type Sampler struct {
	admin    *operator.Admin
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	samples []sample // ring: next is the oldest once full
	next    int
}

type sample struct {
	at     time.Time
	topics map[string]point
	// dead is the number of dead letters over every topic.
	dead int64
}

// point is one topic's backlog at one sample.
type point struct {
	Pending   int64
	OldestAge time.Duration
}

// NewSampler samples admin's topics every interval once Run runs.
func NewSampler(admin *operator.Admin, interval time.Duration, log *slog.Logger) *Sampler {
	n := max(int(History/interval), 2)
	return &Sampler{admin: admin, interval: interval, log: log, samples: make([]sample, 0, n)}
}

// Run samples until ctx is done. The first sample comes after a random
// part of the interval, so that relays started together (a deploy, the end
// of an outage) do not all count the outbox at the same moments.
func (s *Sampler) Run(ctx context.Context) {
	first := time.NewTimer(rand.N(s.interval))
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample takes one sample now.
func (s *Sampler) Sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topics, err := s.admin.Topics(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("console: backlog sample failed", "error", err)
		}
		return
	}
	smp := sample{at: time.Now(), topics: make(map[string]point, len(topics))}
	for _, t := range topics {
		smp.topics[t.Topic] = point{Pending: t.Pending, OldestAge: t.OldestAge}
		smp.dead += t.DeadLetters
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < cap(s.samples) {
		s.samples = append(s.samples, smp)
		return
	}
	s.samples[s.next] = smp
	s.next = (s.next + 1) % len(s.samples)
}

// series returns each topic's points of the last hour, oldest first (a
// topic absent from a sample had no backlog then: 0), and the time span
// they cover.
func (s *Sampler) series() (map[string][]point, time.Duration) {
	if s == nil {
		return nil, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.samples)
	ordered := make([]sample, 0, n)
	for i := range n {
		ordered = append(ordered, s.samples[(s.next+i)%n])
	}
	out := map[string][]point{}
	for i, smp := range ordered {
		for topic, p := range smp.topics {
			if out[topic] == nil {
				out[topic] = make([]point, n)
			}
			out[topic][i] = p
		}
	}
	var span time.Duration
	if n > 1 {
		span = ordered[n-1].at.Sub(ordered[0].at)
	}
	return out, span
}

// deadGrowth is how many dead letters the newest sample has beyond the
// oldest one in the history, and the time between them (0 with fewer
// than two samples).
func (s *Sampler) deadGrowth() (int64, time.Duration) {
	if s == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.samples)
	if n < 2 {
		return 0, 0
	}
	oldest, newest := s.samples[s.next%n], s.samples[(s.next+n-1)%n]
	return newest.dead - oldest.dead, newest.at.Sub(oldest.at)
}
