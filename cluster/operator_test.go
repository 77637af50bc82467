package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

// A server removed while it keeps running is not added back by the
// leader's membership loop; once it restarts it is.
func TestRemovedServerStaysOutUntilItRestarts(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	for _, cfg := range cfgs {
		nodes = append(nodes, openNode(t, cfg))
	}
	leader := leaderOf(t, nodes)
	victim := followers(nodes, leader)[0]
	ctx := context.Background()
	if err := victim.RemovePeer(ctx, victim.ID()); err != nil {
		t.Fatal(err)
	}
	if _, ok := voters(t, leader)[victim.ID()]; ok {
		t.Fatalf("%s still in the configuration after its removal", victim.ID())
	}
	// Gossip still sees it alive; reconciliation passes do not add it back.
	for range 3 {
		leader.gossip.pilot.addNewServers()
	}
	if _, ok := leader.gossip.pilot.KnownServers()[raft.ServerID(victim.ID())]; ok {
		t.Fatal("autopilot is told about the removed server")
	}
	if _, ok := voters(t, leader)[victim.ID()]; ok {
		t.Fatal("the leader added the removed server back while it runs")
	}
	if err := leader.RemovePeer(ctx, victim.ID()); !errors.Is(err, errcode.NotFound) {
		t.Fatalf("removing it again: %v, want not_found", err)
	}

	// Restarted with the same data dir, it joins again and is added back.
	var cfg Config
	for i, n := range nodes {
		if n == victim {
			cfg = cfgs[i]
		}
	}
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	back := openNode(t, cfg)
	waitFor(t, 15*time.Second, "the restarted server to be a voter again", func() bool { return voters(t, leaderOf(t, nodes))[back.ID()] })
}

// The only voter can neither leave nor be removed.
func TestLastVoterCannotLeave(t *testing.T) {
	n := open(t, testConfig(t.TempDir(), "boot-a"))
	defer n.Close()
	left := false
	n.OnLeft(func() { left = true })
	if err := n.Leave(context.Background()); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("leave: %v, want last_voter", err)
	}
	if err := n.RemovePeer(context.Background(), n.ID()); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("remove-peer: %v, want last_voter", err)
	}
	if left || !n.IsLeader() {
		t.Fatalf("after refused leave: left %v, leader %v", left, n.IsLeader())
	}
}
