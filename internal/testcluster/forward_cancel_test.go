package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// A blocking acquire or dequeue whose client is gone by the time a
// follower forwards it leaves no one in line: the follower withdraws it
// right after forwarding it, and the leader, which serves the calls of one
// connection concurrently, applies the withdrawal after the request.
func TestARequestWithdrawnAsItIsForwardedLeavesNoWaiter(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := others(c, leader)[0]
	ctx := context.Background()
	if _, err := c.Client(leader).Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "holder", TTLSeconds: 300, BlockSecs: -1}); err != nil {
		t.Fatal(err)
	}
	node := c.Nodes[follower].Server.Node()
	self := rm.Server{ID: c.Nodes[follower].Name, Run: "test"}
	waits := rm.NewWaits()
	keys := rm.NewKeys(node, waits, node, rm.Limits{DefaultTTL: time.Minute, MaxTTL: time.Hour,
		MaxBlock: time.Minute, MaxStateBytes: 1 << 20}, self)
	queues := rm.NewQueues(node, waits, node, rm.QueueLimits{DefaultVisibility: time.Minute, MaxVisibility: time.Hour,
		DefaultMaxAttempts: 5, MaxPayloadBytes: 1 << 20, MaxWait: time.Minute, StagedTxnTTL: time.Minute}, self, nil)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for i := 0; i < 150; i++ {
		if _, err := keys.Acquire(gone, rm.AcquireParams{Key: "k", Owner: "gone", BlockSecs: 60}); err == nil {
			t.Fatal("an acquire of a held key answered with a lease")
		}
		d, err := c.Client(leader).Describe(ctx, "", "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Waiters != 0 {
			t.Fatalf("after %d withdrawn acquires, %d still wait in line", i+1, d.Waiters)
		}
	}
	for i := 0; i < 150; i++ {
		if _, err := queues.Dequeue(gone, rm.DequeueParams{Queue: "q", Owner: "gone", WaitSeconds: 60}); err == nil {
			t.Fatal("a dequeue of an empty queue answered with a message")
		}
		st, err := c.Client(leader).QueueStats(ctx, "", "q", false)
		if err != nil {
			t.Fatal(err)
		}
		if st.WaitingConsumers != 0 {
			t.Fatalf("after %d withdrawn dequeues, %d consumers still wait", i+1, st.WaitingConsumers)
		}
	}
}
