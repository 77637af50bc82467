package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A write the leader acknowledged is seen by a linearizable read through
// the next leader, which may not know yet that the write committed: the
// old leader was cut off before telling its followers (they learn a
// commit from its next request, here delayed). The new leader serves
// reads only once its term's first entry is applied, which commits
// everything before it; its commit index from before its term, confirmed
// in time by a quorum's heartbeats, does not cover the write. The other
// follower lacks the write, so its log is caught up first and that entry
// commits well after the heartbeats answer.
func TestANewLeaderReadsAWriteItDidNotKnowCommitted(t *testing.T) {
	c := Start(t, 3, Configure(slowElections))
	a := c.WaitLeader(10 * time.Second)
	rest := others(c, a)
	b, cc := rest[0], rest[1]
	reader := c.Client(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := reader.Describe(ctx, "", "k"); err != nil {
		t.Fatal(err)
	}

	c.Fabric.Delay(c.Nodes[a].Name, c.Nodes[b].Name, 150*time.Millisecond)
	c.Fabric.Delay(c.Nodes[b].Name, c.Nodes[cc].Name, 100*time.Millisecond)
	c.Partition([]int{a}, []int{cc})
	lease, err := c.Client(a).Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "w", TTLSeconds: 60, BlockSecs: -1})
	if err != nil {
		t.Fatal(err)
	}
	c.Partition([]int{a}, []int{b, cc})
	held := false
	_ = c.Nodes[b].Server.Node().FSM().View(func(v *fsm.View) error {
		rec, _ := v.Key("default", "k")
		held = rec.Lease != nil
		return nil
	})
	if held {
		t.Fatalf("%s applied the write before %s was cut off: nothing left to check", c.Nodes[b].Name, c.Nodes[a].Name)
	}

	node := c.Nodes[b].Server.Node()
	testutil.WaitFor(t, 20*time.Second, c.Nodes[b].Name+" to lead", func() bool { return node.IsLeader() })
	d, err := reader.Describe(ctx, "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.LeaseID != lease.LeaseID {
		t.Fatalf("read through the new leader: lease %q, want %q, acknowledged before", d.LeaseID, lease.LeaseID)
	}
}
