package kafkatest

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// AnswerLoss makes a kfake broker lose its answers to produce requests:
// the broker handles the request (appends its record batches) and then
// closes the connection instead of writing the answer, as when a broker
// fails over, or the network drops, between an append and its answer.
// The client sees a broken connection and cannot tell whether anything
// was appended.
//
// Install it with kfake.ListenFn(a.Listen); arm it with Lose. It reads
// the request headers going in to pair each answer with its request
// (kfake answers a connection's requests one at a time, in order, each
// answer in one write).
type AnswerLoss struct {
	mu   sync.Mutex
	left int // produce answers still to lose; -1 for all
	lost int
}

// Lose makes the broker lose its next n answers to produce requests; -1
// loses every one until Lose(0).
func (a *AnswerLoss) Lose(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.left = n
}

// Lost is the number of produce answers lost so far.
func (a *AnswerLoss) Lost() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lost
}

func (a *AnswerLoss) take() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.left == 0 {
		return false
	}
	if a.left > 0 {
		a.left--
	}
	a.lost++
	return true
}

// Listen is a kfake.ListenFn: net.Listen, with every accepted connection
// watched.
func (a *AnswerLoss) Listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &lossListener{Listener: ln, a: a}, nil
}

type lossListener struct {
	net.Listener
	a *AnswerLoss
}

func (l *lossListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossConn{Conn: c, a: l.a}, nil
}

// errAnswerLost is what kfake's writer sees for an answer that is lost.
var errAnswerLost = errors.New("kafkatest: produce answer lost")

// lossConn is the broker's side of a client connection.
type lossConn struct {
	net.Conn
	a *AnswerLoss

	// Read side, the broker's goroutine that reads requests.
	head [6]byte // a request's size and API key
	got  int     // bytes of head read
	skip int     // bytes of the current request's body left to pass

	mu   sync.Mutex
	keys []int16 // API keys of the requests read and not answered yet
}

func (c *lossConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.scan(p[:n])
	return n, err
}

// scan follows the request stream: int32 size, int16 API key, the rest.
func (c *lossConn) scan(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
			continue
		}
		k := copy(c.head[c.got:], b)
		c.got += k
		b = b[k:]
		if c.got < len(c.head) {
			return
		}
		c.got = 0
		c.skip = int(binary.BigEndian.Uint32(c.head[:4])) - 2
		c.mu.Lock()
		c.keys = append(c.keys, int16(binary.BigEndian.Uint16(c.head[4:])))
		c.mu.Unlock()
	}
}

func (c *lossConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	key := int16(-1)
	if len(c.keys) > 0 {
		key, c.keys = c.keys[0], c.keys[1:]
	}
	c.mu.Unlock()
	if key == int16(kmsg.Produce) && c.a.take() {
		c.Conn.Close()
		return 0, errAnswerLost
	}
	return c.Conn.Write(p)
}
