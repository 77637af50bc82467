package testcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
)

// A node that was down while the log was snapshotted and truncated catches
// up by snapshot install; so does a server that joins later.
func TestLaggingAndNewNodesCatchUpBySnapshot(t *testing.T) {
	small := func(c *config.Server) {
		c.SnapshotThreshold = 64
		c.TrailingLogs = 16
		c.SnapshotInterval = 200 * time.Millisecond
	}
	c := Start(t, 3, Configure(small))
	leader := c.Leader()
	lagging := others(c, leader)[0]
	c.Stop(lagging)
	cl := c.RetryingClient(leader)
	for i := 0; i < 150; i++ {
		commit(t, acquire(t, cl, fmt.Sprintf("k%d", i), 30), fmt.Sprintf(`{"i":%d}`, i))
	}
	waitFor(t, 10*time.Second, "the leader to snapshot and truncate", func() bool {
		return c.Nodes[leader].Server.Node().LastSnapshotIndex() > 200
	})
	snapAt := c.Nodes[leader].Server.Node().LastSnapshotIndex()
	c.Start(lagging)
	waitFor(t, 20*time.Second, "the lagging node to install a snapshot", func() bool {
		return c.Nodes[lagging].Server.Node().LastSnapshotIndex() >= snapAt
	})
	c.WaitConverged(20 * time.Second)
	if d, err := c.Client(lagging).GetPublic(context.Background(), "", "k149"); err != nil || string(d.Body) != `{"i":149}` {
		t.Fatalf("lagging node after catch-up: %q %v", d.Body, err)
	}

	// A new server joins the running cluster and catches up the same way.
	added := c.Add(Configure(small))
	waitFor(t, 20*time.Second, "the new server to become a voter with the snapshot", func() bool {
		n := c.Nodes[added].Server.Node()
		servers, err := c.Nodes[c.WaitLeader(5*time.Second)].Server.Node().Servers()
		return err == nil && len(servers) == 4 && n.LastSnapshotIndex() >= snapAt
	})
	c.WaitConverged(20 * time.Second)
}
