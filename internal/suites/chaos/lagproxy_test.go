package chaos

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// lagProxy forwards loopback connections to a server and holds every
// answer back for a while: a sink behind it waits that long between the
// server acting on a request and hearing about it, so that a relay killed
// at random is likely to die with a batch stored but not acknowledged
// (the window that makes duplicates).
type lagProxy struct {
	ln     net.Listener
	target string
	lag    time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

func newLagProxy(t *testing.T, target string, lag time.Duration) *lagProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lagProxy{ln: ln, target: target, lag: lag, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *lagProxy) addr() string { return p.ln.Addr().String() }

func (p *lagProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			s.Close()
			c.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.lagged(c, s)
			s.Close()
			c.Close()
		}()
	}
}

// lagged copies src to dst, each chunk lag after it arrived, in order.
func (p *lagProxy) lagged(dst, src net.Conn) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			// The lag is what the proxy is for: each chunk goes on at
			// its due time.
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				for range ch {
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{at: time.Now().Add(p.lag), b: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
}

func (p *lagProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
