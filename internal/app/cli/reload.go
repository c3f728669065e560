package cli

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/outbox-relay/outbox-relay/internal/app/console"
)

// reloadOnHangup reads the config file's sources list again at each
// SIGHUP until ctx ends; stop ends it and waits for a reload under way.
func (f *fleet) reloadOnHangup(ctx context.Context) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			if err := f.reload(ctx); err != nil {
				f.g.log.Error("sources not reloaded; the running ones go on", "error", f.g.files.scrub(err.Error()))
			}
		}
	}()
	return func() { signal.Stop(hup); cancel(); <-done }
}

// reload makes the running sources those of the config file's sources
// list now: a source no longer listed stops (its relays drain) and is
// closed; a new one is opened and started; one whose database URL,
// schema, producer or weight changed is both. Only the sources list is read
// again: every other option, the routes included, keeps its value.
func (f *fleet) reload(ctx context.Context) error {
	fc, err := loadFile(f.g.configPath, f.g.known)
	if err != nil {
		return err
	}
	f.g.file = fc
	list, err := f.g.parseSources()
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return errors.New("outbox: config: the file lists no sources now; a run of a sources list keeps at least one")
	}
	var removed, added []string
	for _, p := range f.snapshot() {
		if slices.Contains(list, p.source) {
			continue
		}
		if err := f.srcs.Remove(p.name); err != nil {
			return err
		}
		f.drop(p)
		removed = append(removed, p.name)
	}
	for _, s := range list {
		if slices.ContainsFunc(f.snapshot(), func(p *sourceParts) bool { return p.source == s }) {
			continue
		}
		if err := f.add(ctx, s); err != nil {
			return err
		}
		added = append(added, s.name)
	}
	f.rebuildConsole()
	f.g.log.Info("sources reloaded", "added", added, "removed", removed, "sources", len(f.snapshot()))
	return nil
}

// add opens s and starts its relays.
func (f *fleet) add(ctx context.Context, s source) error {
	p, err := f.open(ctx, s)
	if err != nil {
		return err
	}
	rs, err := f.relaySource(p)
	if err == nil {
		err = f.srcs.Add(rs)
	}
	if err != nil {
		f.drop(p)
		return err
	}
	f.watch(p)
	return nil
}

// drop forgets p and closes it.
func (f *fleet) drop(p *sourceParts) {
	f.mu.Lock()
	f.parts = slices.DeleteFunc(f.parts, func(q *sourceParts) bool { return q == p })
	f.mu.Unlock()
	f.close(p)
}

// serveConsole builds the console of the sources, which reload rebuilds
// as they change.
func (f *fleet) serveConsole() (http.Handler, error) {
	c, err := sourcesConsole(f.g, f.snapshot(), f.srcs.States, f.base, f.o, f.tokens, f.routes, f.planned)
	if err != nil {
		return nil, err
	}
	f.con = &swapHandler{}
	f.con.h.Store(c)
	return f.con, nil
}

// rebuildConsole rebuilds the console after a reload, when there is one.
func (f *fleet) rebuildConsole() {
	if f.con == nil {
		return
	}
	c, err := sourcesConsole(f.g, f.snapshot(), f.srcs.States, f.base, f.o, f.tokens, f.routes, f.planned)
	if err != nil {
		f.g.log.Error("console not rebuilt after the reload; it shows the sources as they were", "error", err)
		return
	}
	f.con.h.Store(c)
}

// swapHandler serves the console it holds now.
type swapHandler struct {
	h atomic.Pointer[console.Console]
}

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.h.Load().ServeHTTP(w, r) }
