package relay

import (
	"context"
	"testing"
	"time"
)

func TestSignalsAwaitAnnouncementsAfterTheMark(t *testing.T) {
	t.Parallel()
	var none *signals
	none.emit(sigStarted, 0) // a production relay's: nothing, no panic
	if d := time.Since(none.now()); d < 0 || d > time.Minute {
		t.Fatalf("a nil observer's clock is off by %s", d)
	}

	s := newSignals()
	s.emit(sigLeaseHeld, 256)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := s.await(ctx, sigLeaseHeld, 0, nil); err != nil || v != 256 {
		t.Fatalf("an announcement made before the wait: %d, %v", v, err)
	}
	mark := s.count(sigLeaseHeld)
	got := make(chan int)
	go func() {
		v, _ := s.await(ctx, sigLeaseHeld, mark, func(v int) bool { return v == 128 })
		got <- v
	}()
	s.emit(sigLeaseHeld, 200)  // does not match
	s.emit(sigRebalanced, 128) // another signal
	s.emit(sigLeaseHeld, 128)
	if v := <-got; v != 128 {
		t.Fatalf("await returned %d, want the matching announcement after the mark", v)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if _, err := s.await(short, sigStopped, 0, nil); err == nil {
		t.Fatal("await returned for a signal never announced")
	}

	s.skew.Add(int64(time.Hour))
	if d := s.now().Sub(time.Now()); d < 59*time.Minute {
		t.Fatalf("clock moved ahead by %s, want an hour", d)
	}
}
