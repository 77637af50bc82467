//go:build linux

package client

import (
	"context"
	"net"
	"net/http"
	"syscall"
	"testing"
)

// The client's connections probe a silent server: a subscription to a
// server that vanished without closing its connection ends within about
// 30 s instead of the system's default (minutes).
func TestConnectionsProbeASilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := New("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.http.Transport.(*http.Transport).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	if err := raw.Control(func(fd uintptr) {
		for name, opt := range map[string]int{"SO_KEEPALIVE": syscall.SO_KEEPALIVE} {
			got[name], _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt)
		}
		for name, opt := range map[string]int{"TCP_KEEPIDLE": syscall.TCP_KEEPIDLE, "TCP_KEEPINTVL": syscall.TCP_KEEPINTVL,
			"TCP_KEEPCNT": syscall.TCP_KEEPCNT} {
			got[name], _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if got["SO_KEEPALIVE"] != 1 {
		t.Fatalf("keepalive is off: %v", got)
	}
	if silent := got["TCP_KEEPIDLE"] + got["TCP_KEEPINTVL"]*got["TCP_KEEPCNT"]; silent > 30 {
		t.Fatalf("a silent server is given up on after %d s (%v), want at most 30 s", silent, got)
	}
}
