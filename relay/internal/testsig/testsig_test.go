package testsig

import (
	"context"
	"testing"
	"time"
)

func TestSignalsAwaitAnnouncementsAfterTheMark(t *testing.T) {
	t.Parallel()
	var none *Bus
	none.Emit(Started, 0) // a production relay's: nothing, no panic
	if d := time.Since(none.Now()); d < 0 || d > time.Minute {
		t.Fatalf("a nil observer's clock is off by %s", d)
	}

	s := New()
	s.Emit(LeaseHeld, 256)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := s.Await(ctx, LeaseHeld, 0, nil); err != nil || v != 256 {
		t.Fatalf("an announcement made before the wait: %d, %v", v, err)
	}
	mark := s.Count(LeaseHeld)
	got := make(chan int)
	go func() {
		v, _ := s.Await(ctx, LeaseHeld, mark, func(v int) bool { return v == 128 })
		got <- v
	}()
	s.Emit(LeaseHeld, 200)  // does not match
	s.Emit(Rebalanced, 128) // another signal
	s.Emit(LeaseHeld, 128)
	if v := <-got; v != 128 {
		t.Fatalf("await returned %d, want the matching announcement after the mark", v)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if _, err := s.Await(short, Stopped, 0, nil); err == nil {
		t.Fatal("await returned for a signal never announced")
	}

	s.Advance(time.Hour)
	if d := s.Now().Sub(time.Now()); d < 59*time.Minute {
		t.Fatalf("clock moved ahead by %s, want an hour", d)
	}
}
