package cluster

import (
	"context"
	"errors"
	"net"
	"net/rpc"
	"sync"
	"syscall"
	"testing"
	"time"
)

// brokenPipe is a network whose connections take the protocol byte and
// then fail every write, as a connection the peer has reset does, while
// reads wait until the connection is closed.
type brokenPipe struct{}

func (b *brokenPipe) Listen(string) (net.Listener, error) { return nil, errors.New("no listening") }

func (b *brokenPipe) Dial(context.Context, string) (net.Conn, error) {
	return &pipeConn{closed: make(chan struct{})}, nil
}

type pipeConn struct {
	net.Conn // nil: only what the RPC client uses is implemented
	wrote    bool
	once     sync.Once
	closed   chan struct{}
}

func (c *pipeConn) Write(b []byte) (int, error) {
	if !c.wrote {
		c.wrote = true
		return len(b), nil
	}
	return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}
}

func (c *pipeConn) Read([]byte) (int, error) {
	<-c.closed
	return 0, net.ErrClosed
}

func (c *pipeConn) Close() error                     { c.once.Do(func() { close(c.closed) }); return nil }
func (c *pipeConn) SetWriteDeadline(time.Time) error { return nil }

// A forwarded request whose write failed did not reach the peer whole, and
// the peer acts on none it has not read whole: it is reported as not
// delivered, which the follower sends again, not as of an unknown outcome.
func TestARequestWhoseWriteFailedIsNotDelivered(t *testing.T) {
	p := &peers{network: &brokenPipe{}, clients: map[string]*rpc.Client{}}
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var reply ProposeReply
	err := p.call(ctx, "leader:1", "Propose", ProposeArgs{Command: []byte("cmd")}, &reply)
	var nd notDelivered
	if !errors.As(err, &nd) {
		t.Fatalf("a request whose write failed: %v, want it not delivered", err)
	}
}
