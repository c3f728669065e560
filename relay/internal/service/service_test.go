package service

import (
	"context"
	"errors"
	"testing"
)

func TestLoopStartStop(t *testing.T) {
	t.Parallel()
	var l Loop
	l.Stop() // before Start: nothing
	started, ended := make(chan struct{}), make(chan struct{})
	if err := l.StartLoop(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		close(ended)
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := l.StartLoop(context.Background(), func(context.Context) {}); !errors.Is(err, ErrStarted) {
		t.Fatalf("a second start: %v, want ErrStarted", err)
	}
	l.Stop()
	select {
	case <-ended:
	default:
		t.Fatal("Stop returned before the loop did")
	}
	l.Stop() // twice: nothing
}

func TestLoopEndsWithItsContext(t *testing.T) {
	t.Parallel()
	var l Loop
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	if err := l.StartLoop(ctx, func(ctx context.Context) { <-ctx.Done(); close(ended) }); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-ended
	l.Stop()
}
