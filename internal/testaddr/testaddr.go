// Package testaddr hands tests loopback addresses to listen on. It has no
// dependencies inside the module so that every package's tests, the
// cluster package's own included, can use it.
package testaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// Free returns a loopback address that nothing else on the machine will
// take before the caller binds it, and that stays the caller's while the test
// process lives, so a node can be restarted on it.
//
// A port that was free a moment ago on 127.0.0.1 is easily lost: outbound
// connections and other test processes draw from the same ephemeral range. So
// each test process picks its own address in 127.0.0.0/8 (outbound
// connections to it leave from 127.0.0.1, so they never occupy its ports),
// asks the kernel for a free port there and never hands out one port twice.
func Free(t testing.TB) string {
	t.Helper()
	addrs.Lock()
	defer addrs.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", net.JoinHostPort(addrs.ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		// Gossip binds UDP on the same port.
		pc, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err != nil {
			continue
		}
		pc.Close()
		if !addrs.given[addr] {
			addrs.given[addr] = true
			return addr
		}
	}
	t.Fatal("no free port on " + addrs.ip)
	return ""
}

var addrs = struct {
	sync.Mutex
	ip    string
	given map[string]bool
}{ip: processLoopback(), given: map[string]bool{}}

// processLoopback returns an address in 127.0.0.0/8 other than 127.0.0.1,
// chosen at random for this process; 127.0.0.1 where the others do not work.
func processLoopback() string {
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		return "127.0.0.1"
	}
	ln.Close()
	return ip
}
