package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// A blocked acquirer waiting on a follower is told of its grant by the
// leader as soon as the leader applies it, instead of when the follower
// applies the step itself.
func TestLeaderPushesGrantsToTheFollowerTheAcquirerWaitsOn(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := others(c, leader)[0]
	ctx := context.Background()
	held := acquire(t, c.Client(leader), "k", 60)
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Client(follower).Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "w", TTLSeconds: 30, BlockSecs: 30})
		if err != nil {
			t.Errorf("queued acquire: %v", err)
		}
		got <- l
	}()
	waitQueued(t, c.Client(leader), "k", 1)
	if _, err := c.Client(leader).Release(ctx, held.Ref(), false); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l == nil || l.FencingToken != held.FencingToken+1 {
			t.Fatalf("the waiter got %+v", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter on the follower was not served")
	}
	// The follower may have applied the step before the push arrived; the
	// leader pushes it all the same.
	waitFor(t, 5*time.Second, "the leader to push the grant", func() bool {
		return counter(t, c, leader, "raftlockd_grants_pushed_total") >= 1
	})
}

func counter(t *testing.T, c *Cluster, i int, name string) float64 {
	t.Helper()
	mfs, err := c.Nodes[i].Server.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var n float64
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
			return n
		}
	}
	return 0
}
