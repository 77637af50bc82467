package testcluster

import (
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/testutil"
)

// TestGossipHealsAfterALongPartition cuts a node off for longer than gossip
// keeps talking to members it declared dead; once the network heals, every
// node must see every other alive again (otherwise the leader would remove
// a healthy voter after --dead-server-timeout).
func TestGossipHealsAfterALongPartition(t *testing.T) {
	c := Start(t, 3)
	cut := (c.WaitLeader(10*time.Second) + 1) % 3
	rest := others(c, cut)
	c.Partition([]int{cut}, rest)
	dead := func(from, id int) bool {
		for _, m := range c.Nodes[from].Server.Node().Members() {
			if m.ID == c.Nodes[id].Name {
				return m.Status == "dead"
			}
		}
		return false
	}
	testutil.WaitFor(t, 15*time.Second, "both sides to declare the other dead", func() bool {
		return dead(rest[0], cut) && dead(cut, rest[0])
	})
	// Beyond memberlist's gossip-to-the-dead window (5s in the fast profile).
	time.Sleep(6 * time.Second)
	c.Heal()
	testutil.WaitFor(t, 15*time.Second, "every node to see every other alive", func() bool {
		for i := range c.Nodes {
			for j := range c.Nodes {
				if i != j && dead(i, j) {
					return false
				}
			}
		}
		return true
	})
}
