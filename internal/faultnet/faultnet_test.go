package faultnet

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// link returns both ends of a connection node b dialed to node a.
func link(t *testing.T, f *Fabric) (a, b net.Conn) {
	t.Helper()
	ln, err := f.Network("a").Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err = f.Network("b").Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a = <-accepted
	if a == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close() })
	// The accepting end learns its peer from the first bytes.
	exchange(t, b, a, "hello")
	return a, b
}

func exchange(t *testing.T, from, to net.Conn, msg string) {
	t.Helper()
	if _, err := from.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	_ = to.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(to, buf); err != nil || string(buf) != msg {
		t.Fatalf("read %q, %v; want %q", buf, err, msg)
	}
	_ = to.SetReadDeadline(time.Time{})
}

func timedOut(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// A frozen node reads and sends nothing; what was held arrives on thaw.
func TestFreezeHoldsBytesUntilThaw(t *testing.T) {
	f := New()
	a, b := link(t, f)
	f.Freeze("a")
	if _, err := b.Write([]byte("to a")); err != nil {
		t.Fatalf("a write to a frozen node is taken: %v", err)
	}
	_ = a.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := a.Read(make([]byte, 8)); !timedOut(err) {
		t.Fatalf("frozen node read: %v, want a timeout", err)
	}
	_ = a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := a.Write([]byte("from a")); !timedOut(err) {
		t.Fatalf("frozen node write: %v, want a timeout", err)
	}
	_ = a.SetWriteDeadline(time.Time{})
	_ = b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := b.Read(make([]byte, 8)); !timedOut(err) {
		t.Fatalf("read from a frozen node: %v, want a timeout", err)
	}
	f.Thaw("a")
	buf := make([]byte, 4)
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "to a" {
		t.Fatalf("after the thaw a read %q, %v", buf, err)
	}
	exchange(t, a, b, "from a")
}

// A client whose peer does not go through the fabric (an HTTP server)
// cannot send to a frozen node either.
func TestFreezeBlocksClientsOfUnwrappedServers(t *testing.T) {
	f := New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f.Register(ln.Addr().String(), "a")
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := f.Dialer("client")(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	exchange(t, c, c, "echo")
	f.Freeze("a")
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Write([]byte("x")); !timedOut(err) {
		t.Fatalf("write to a frozen server: %v, want a timeout", err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	f.Thaw("a")
	exchange(t, c, c, "again")
}

// Latency applies to both directions of a link.
func TestDelayIsSymmetric(t *testing.T) {
	f := New()
	a, b := link(t, f)
	const d = 60 * time.Millisecond
	f.Delay("a", "b", d)
	for _, dir := range []struct {
		from, to net.Conn
		name     string
	}{{b, a, "b to a"}, {a, b, "a to b"}} {
		start := time.Now()
		exchange(t, dir.from, dir.to, "ping")
		if took := time.Since(start); took < d {
			t.Errorf("%s took %s, want at least %s", dir.name, took, d)
		}
	}
	f.Heal()
	exchange(t, a, b, "fast")
}

// A killed node's peers see their connections reset and its address
// refuse connections until it is revived.
func TestKillResetsPeersAndRefusesDials(t *testing.T) {
	f := New()
	a, b := link(t, f)
	f.Kill("a")
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := b.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer of a killed node read: %v, want ECONNRESET", err)
	}
	if _, err := a.Write([]byte("x")); err == nil {
		t.Fatal("the killed node's own end still writes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := a.LocalAddr().String()
	if _, err := f.Network("b").Dial(ctx, addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a killed node: %v, want ECONNREFUSED", err)
	}
	f.Revive("a")
	c, err := f.Network("b").Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial after revive: %v", err)
	}
	c.Close()
}
