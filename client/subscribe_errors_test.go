package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

func subscribeErr(t *testing.T, c *Client) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o", WaitSeconds: 10}, func(*Delivery) error { return nil })
}

// A server that is no HTTP server at all (it answers garbage) is not one
// going away: the subscription fails, it is not opened again and again.
func TestASubscriptionToANonHTTPServerFails(t *testing.T) {
	addr := rawServer(t, func(conn net.Conn) {
		defer conn.Close()
		_, _ = conn.Read(make([]byte, 4096))
		_, _ = conn.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n\r\n"))
	})
	c, err := New("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := subscribeErr(t, c); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a subscription to a non-HTTP server: %v, want its failure at once", err)
	}
}

// A URL the transport cannot use (a misconfiguration) fails the
// subscription at once.
func TestASubscriptionWithAnUnsupportedSchemeFails(t *testing.T) {
	c, err := New("ftp://127.0.0.1:1")
	if err != nil {
		t.Skip(err)
	}
	if err := subscribeErr(t, c); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a subscription to ftp://: %v, want its failure at once", err)
	}
}

// rawServer accepts TCP connections on a loopback address and hands each to
// handle in a goroutine of its own until the test ends.
func rawServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(conn)
		}
	}()
	return ln.Addr().String()
}
