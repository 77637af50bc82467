package cluster

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/auth"
)

// boundTLS is a server certificate of testCA bound to node id.
func boundTLS(t *testing.T, id string) PeerTLS {
	t.Helper()
	b, err := testCA().Issue(auth.RoleServer, auth.IssueOptions{Name: "node " + id, Node: id})
	if err != nil {
		t.Fatal(err)
	}
	return auth.NewStaticSource(b)
}

// dialAs opens a Raft connection to addr the way a server naming itself id
// and presenting certs does.
func dialAs(t *testing.T, certs PeerTLS, id, addr string) error {
	t.Helper()
	c, err := layerOf(certs, id).Dial(raft.ServerAddress(addr), 5*time.Second)
	if err != nil {
		return err
	}
	t.Cleanup(func() { c.Close() })
	// The server closes a connection it refuses right after it answered.
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// layerOf is the Raft stream layer of a server naming itself id and
// presenting certs.
func layerOf(certs PeerTLS, id string) *streamLayer {
	return &streamLayer{m: &mux{self: id, island: func() string { return "" }, certs: certs}, network: tlsNetwork{TCP{}, certs}}
}

// A server whose certificate is bound to a node id is refused under any
// other id, by the servers it dials and by those that dial it; under its
// own id, and with a certificate bound to none, it is let in.
func TestACertificateBoundToANodeIsThatNodesOnly(t *testing.T) {
	cfg := testConfig(t.TempDir(), "boot-a")
	cfg.TLS = boundTLS(t, "n1")
	n := open(t, cfg)
	t.Cleanup(func() { _ = n.Close() })

	if err := dialAs(t, boundTLS(t, "n7"), "n3", n.RaftAddr()); err == nil {
		t.Fatal("a server naming itself n3 with n7's certificate was let in")
	}
	waitFor(t, 5*time.Second, "the refusal to be counted", func() bool { return n.mux.refusals.Load() == 1 })
	for _, c := range []struct {
		certs PeerTLS
		id    string
	}{{boundTLS(t, "n3"), "n3"}, {peerTLS(), "n3"}} {
		if err := dialAs(t, c.certs, c.id, n.RaftAddr()); err != nil {
			t.Fatalf("%s with its own certificate: %v", c.id, err)
		}
	}
	if got := n.mux.refusals.Load(); got != 1 {
		t.Fatalf("%d refusals, want 1", got)
	}

	// The other way round: n2's certificate on a server that names itself
	// n1 is refused by the server that dials it.
	cfg = testConfig(t.TempDir(), "boot-b")
	cfg.TLS = boundTLS(t, "n2")
	wrong := open(t, cfg)
	t.Cleanup(func() { _ = wrong.Close() })
	if _, err := layerOf(boundTLS(t, "n3"), "n3").Dial(raft.ServerAddress(wrong.RaftAddr()), 5*time.Second); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("dialling a server naming itself n1 with n2's certificate: %v", err)
	}
}

// A certificate bound to a node cannot skip the node check by speaking the
// protocol of builds older than the check: those never held one. A server
// taking it that way is refused, and so is a server found behind it.
func TestABoundCertificateIsRefusedOnTheOlderProtocol(t *testing.T) {
	cfg := testConfig(t.TempDir(), "boot-a")
	cfg.TLS = boundTLS(t, "n1")
	n := open(t, cfg)
	t.Cleanup(func() { _ = n.Close() })

	c, err := dialProto(t.Context(), tlsNetwork{TCP{}, boundTLS(t, "n7")}, n.RaftAddr(), 5*time.Second, protoRaft)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("n7's certificate on the older protocol: %v, want the connection closed", err)
	}
	waitFor(t, 5*time.Second, "the refusal to be counted", func() bool { return n.mux.refusals.Load() == 1 })

	older := layerOf(peerTLS(), "n3")
	older.older = func(string) bool { return true }
	if _, err := older.Dial(raft.ServerAddress(n.RaftAddr()), 5*time.Second); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("dialling, as an older build, a server with a bound certificate: %v", err)
	}
	// A certificate bound to none still speaks the older protocol.
	c, err = dialProto(t.Context(), tlsNetwork{TCP{}, peerTLS()}, n.RaftAddr(), 5*time.Second, protoRaft)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("an unbound certificate on the older protocol: %v, want the connection kept open", err)
	}
}
