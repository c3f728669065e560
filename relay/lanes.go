package relay

import "github.com/outbox-relay/outbox-relay/relay/internal/lanes"

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
		r.pend[w].Add(per[w])
		select {
		case r.wake[w] <- struct{}{}:
		default:
		}
	}
}
