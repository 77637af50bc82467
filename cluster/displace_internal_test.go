package cluster

import (
	"testing"

	"github.com/hashicorp/raft"
)

// A server that leaves the configuration while gossip has it alive at
// another Raft address (containers restarted on each other's addresses:
// another server took its old one over) was not removed: whichever server
// leads adds it back at its new address. One that leaves otherwise is not
// added back until it rejoins.
func TestAServerWhoseAddressAnotherTookIsNotTakenForRemoved(t *testing.T) {
	g := &gossip{members: map[string]*Member{}, removed: map[string]string{}}
	config := func(servers ...raft.Server) { g.noteConfig(servers) }
	at := func(id, addr string) raft.Server {
		return raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(addr)}
	}
	alive := func(id, addr string) { g.members[id] = &Member{ID: id, RaftAddr: addr, Status: "alive"} }
	alive("n1", "a1")
	alive("n2", "a2")
	alive("n3", "a3")
	config(at("n1", "a1"), at("n2", "a2"), at("n3", "a3"))
	// n3 came back at a2, n2 at a3: n2 takes a3 over, and n3 leaves.
	alive("n2", "a3")
	alive("n3", "a2")
	config(at("n1", "a1"), at("n2", "a3"))
	if g.wasRemoved("n3") {
		t.Fatal("a server whose address another took is taken for removed: it would never be added back")
	}
	config(at("n1", "a1"), at("n2", "a3"), at("n3", "a2"))
	config(at("n1", "a1"), at("n2", "a3"))
	if !g.wasRemoved("n3") {
		t.Fatal("a server removed at the address it announces is not taken for removed")
	}
}
