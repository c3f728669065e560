// Package tcpproxy is a loopback TCP proxy for tests: a sink connects to
// the proxy instead of a shared server, and the test cuts the sink's
// connections (Restart) or refuses them for a while (Break) without
// touching the server, which other tests share, or holds every byte in
// flight (Hold): a server that hangs without closing anything.
package tcpproxy

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards connections from its loopback address to a target.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]bool
	broken bool
	closed bool
	// restore ends the Break made by Down.
	restore func()
	// held, while not nil, is closed when a Hold ends: no byte goes
	// through until then.
	held chan struct{}
	wg   sync.WaitGroup
}

// New starts a proxy to target (host:port) on a free loopback port; it is
// closed when the test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("tcpproxy: listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept(ln)
	tb.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ln.Addr().String()
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.broken || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for { // ends when either side goes away
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			held := p.held
			p.mu.Unlock()
			if held != nil {
				<-held
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// dropAll closes every proxied connection. Callers hold p.mu.
func (p *Proxy) dropAll() {
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restart cuts every connection through the proxy; new ones are accepted.
func (p *Proxy) Restart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropAll()
	return nil
}

// Break cuts every connection and closes the listening socket, so that
// new connections are refused, as by a server that is down, until the
// returned restore listens again on the same address.
func (p *Proxy) Break() (restore func()) {
	p.mu.Lock()
	p.broken = true
	ln := p.ln
	p.dropAll()
	p.mu.Unlock()
	_ = ln.Close()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || !p.broken {
			return
		}
		nl, err := net.Listen("tcp", ln.Addr().String())
		if err != nil {
			panic("tcpproxy: listen again on " + ln.Addr().String() + ": " + err.Error())
		}
		p.ln, p.broken = nl, false
		p.wg.Add(1)
		go p.accept(nl)
	}
}

// Down breaks the proxy (see Break) until Up: the destination behind it
// is down as a whole, as sinktest's Env.Down wants it. It returns nil, to
// fit Env.Down.
func (p *Proxy) Down() error {
	restore := p.Break()
	p.mu.Lock()
	p.restore = restore
	p.mu.Unlock()
	return nil
}

// Up restores the proxy after Down; without a Down before it, it does
// nothing. It returns nil, to fit Env.Up.
func (p *Proxy) Up() error {
	p.mu.Lock()
	restore := p.restore
	p.restore = nil
	p.mu.Unlock()
	if restore != nil {
		restore()
	}
	return nil
}

// Hold stops every byte in flight, both ways, on every connection (new
// ones are accepted and held too), until the returned resume: the server
// behind the proxy hangs while its connections stay open.
func (p *Proxy) Hold() (resume func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
	held := p.held
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.held == held {
			close(held)
			p.held = nil
		}
	}
}

// Close stops the proxy and cuts its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	p.dropAll()
	if p.held != nil {
		close(p.held) // the held pipes find their connections closed
		p.held = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
}
