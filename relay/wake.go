package relay

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/wake"
)

// Wake-up: docs/design.md ("Wake-up") explains it once. Package wake
// runs it (one per process: its LISTEN session, the watcher's election,
// the looks for new and due rows, the WAL stream); this file holds what
// it acts on, the relay's workers, which it wakes through wakeSet. Wake-ups
// are an optimization: a lost one costs latency up to PollInterval,
// never a message.

// wakeAll makes every worker visit all of its lanes now.
func (r *Relay) wakeAll() {
	for _, w := range r.workers {
		w.wakeUp(nil)
	}
}

// wakeWorker makes worker w visit all of its lanes now.
func (r *Relay) wakeWorker(w int) { r.workers[w].wakeUp(nil) }

// wakeUp wakes the worker about ls (nil: every lane of it).
func (w *worker) wakeUp(ls *lanes.Set) {
	if ls == nil {
		w.pend.AddAll()
	} else {
		w.pend.Add(*ls)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// wakeSet wakes the workers of lanes, or all of them when lanes is empty.
func (r *Relay) wakeSet(ls lanes.Set) {
	r.stats.Wakeups.Add(1)
	if ls.Empty() {
		r.wakeAll()
		return
	}
	r.wakeLanes(ls)
}

// listen starts the wake-up of cfg.Schema for one process, as cfg.Wakeup
// says, calling wakeUp with the lanes that may have new rows (an empty
// set: any lane), until ctx ends or stop is called; stop also waits for
// it. A relay runs it itself unless it is in a Set, which runs one for
// all its relays. It holds one connection of pool (LISTEN) and, while
// this process follows the WAL, a replication connection of its own.
//
// members is called with freed false when relays came or went, and true
// when lanes were handed back (store.FreedPayload). The Waker it returns
// (nil when it could not start) hears what the workers claim (see
// Relay.waker).
func listen(ctx context.Context, pool *pgxpool.Pool, cfg Config, wakeUp func(lanes.Set), members func(freed bool)) (_ *wake.Waker, stop func()) {
	cfg = cfg.WithDefaults()
	k, err := wake.New(wake.Config{
		Pool: pool, Schema: cfg.Schema, Mode: cfg.Wakeup, WatchInterval: cfg.WatchInterval, Heartbeat: cfg.Heartbeat,
		Logger: cfg.Logger, Hooks: cfg.Hooks, Signals: cfg.sig, Wake: wakeUp, Members: members,
	})
	if err == nil {
		err = k.Start(ctx)
	}
	if err != nil {
		// The workers' safety poll still finds every row.
		cfg.Logger.Error("cannot listen for notifications; polling", "error", err)
		return nil, func() {}
	}
	return k, k.Stop
}

// claimed tells the wake-up which rows a claim returned (see
// wake.Waker.Claimed).
func (r *Relay) claimed(batch []claim.Row) {
	if r.waker == nil {
		return
	}
	r.waker.Claimed(func(yield func(int64) bool) {
		for i := range batch {
			if !yield(batch[i].Msg.Seq) {
				return
			}
		}
	})
}

// wakeLanes wakes the workers that claim any of ls, naming those lanes to
// each (see lanes.Pending); all of them while this relay does not know
// its lanes yet.
func (r *Relay) wakeLanes(ls lanes.Set) {
	owned := r.lease.Owned().Load()
	var mine lanes.Set
	for i := range mine {
		mine[i] = owned[i] & ls[i]
	}
	if owned.Empty() {
		r.wakeAll()
		return
	}
	n := r.cfg.Workers
	per := make([]lanes.Set, n)
	for l := range lanes.N {
		if mine.Has(l) {
			per[l%n].Add(l)
		}
	}
	for w := range per {
		if per[w].Empty() {
			continue
		}
		r.workers[w].wakeUp(&per[w])
	}
}
