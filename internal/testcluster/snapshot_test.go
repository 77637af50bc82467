package testcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
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

// A follower restarted with nothing to replay (its last snapshot covers
// every committed entry) serves a backup at once: raft's state machine
// goroutine has seen no entry in this run, so the follower must wait for
// the no-op it proposes to reach it before it asks raft for a snapshot.
func TestARestartedFollowerServesABackup(t *testing.T) {
	c := Start(t, 3)
	leader := c.Leader()
	f := others(c, leader)[0]
	commit(t, acquire(t, c.RetryingClient(leader), "k", 30), `{"v":1}`)
	get := func(what string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, c.URL(f)+"/v1/cluster/snapshot", nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.OperatorHTTPClient("operator").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", what, res.StatusCode, body)
		}
	}
	for round := 0; round < 5; round++ {
		// The follower's own snapshot covers everything committed so far.
		get(fmt.Sprintf("backup %d through the follower before its restart", round))
		c.Stop(f)
		c.Start(f)
		waitFor(t, 10*time.Second, "the follower to know the leader", func() bool {
			id, _ := c.Nodes[f].Server.Node().Leader()
			return id != ""
		})
		get(fmt.Sprintf("backup %d through the restarted follower", round))
	}
}
