package cluster

import (
	"testing"

	"github.com/hashicorp/raft"
)

// A server that leaves the configuration because another took over its
// Raft address (containers restarted on each other's addresses) was not
// removed: the leader adds it back at the address it announces now. One
// that leaves otherwise is not added back until it rejoins.
func TestAServerWhoseAddressAnotherTookIsNotTakenForRemoved(t *testing.T) {
	g := &gossip{members: map[string]*Member{}, removed: map[string]string{}, displaced: map[string]bool{}}
	servers := func(ids ...string) []raft.Server {
		var out []raft.Server
		for _, id := range ids {
			out = append(out, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":9342")})
		}
		return out
	}
	g.noteConfig(servers("n1", "n2", "n3"))
	g.displace([]string{"n3"}, true)
	g.noteConfig(servers("n1", "n2"))
	if g.wasRemoved("n3") {
		t.Fatal("a server whose address another took is taken for removed: it would never be added back")
	}
	g.noteConfig(servers("n1", "n2", "n3"))
	g.noteConfig(servers("n1", "n2"))
	if !g.wasRemoved("n3") {
		t.Fatal("a server removed later, for another reason, is not taken for removed")
	}
	// A takeover that did not happen leaves nothing behind.
	g.noteConfig(servers("n1", "n2"))
	g.displace([]string{"n2"}, true)
	g.displace([]string{"n2"}, false)
	g.noteConfig(servers("n1"))
	if !g.wasRemoved("n2") {
		t.Fatal("a displacement undone still excuses a later removal")
	}
}
