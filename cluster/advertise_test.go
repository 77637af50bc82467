package cluster

import (
	"net"
	"testing"
)

// A gossip advertise address may name a host (a container's service name):
// memberlist needs an IP, so the name is resolved.
func TestResolveHost(t *testing.T) {
	for _, ip := range []string{"10.1.2.3", "::1"} {
		if got, err := resolveHost(ip); err != nil || got != ip {
			t.Errorf("resolveHost(%q) = %q, %v; want it unchanged", ip, got, err)
		}
	}
	got, err := resolveHost("localhost")
	if ip := net.ParseIP(got); err != nil || ip == nil || !ip.IsLoopback() {
		t.Errorf("resolveHost(localhost) = %q, %v; want a loopback address", got, err)
	}
	if got, err := resolveHost("no-such-host.invalid"); err == nil {
		t.Errorf("resolveHost(no-such-host.invalid) = %q, want an error", got)
	}
}
