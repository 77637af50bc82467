// Package testcluster runs whole raftlockd nodes (HTTP API, Raft, gossip)
// inside a test process, on loopback, joined into one cluster over a
// faultnet fabric, so that tests can stop and restart nodes, partition
// them, and check that the survivors converge.
package testcluster

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/faultnet"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
)

// Cluster is a set of in-process nodes.
type Cluster struct {
	t      testing.TB
	Fabric *faultnet.Fabric
	Nodes  []*Node
}

// Node is one member; Server is nil while the node is stopped.
type Node struct {
	Name   string
	Config config.Server
	Server *server.Server
}

// Option adjusts every node's configuration before start.
type Option func(*config.Server)

// Start runs size nodes that bootstrap one cluster and waits until every
// node is a voter and a leader serves. The nodes stop when the test ends.
func Start(t testing.TB, size int, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Fabric: faultnet.New()}
	var gossip []string
	for i := 0; i < size; i++ {
		cfg := testutil.Config(t, t.TempDir())
		cfg.NodeID = fmt.Sprintf("n%d", i+1)
		cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
		cfg.BootstrapExpect = size
		cfg.DeadServerTimeout = 30 * time.Second
		cfg.LeaderWait = 2 * time.Second
		gossip = append(gossip, cfg.GossipListen)
		c.Nodes = append(c.Nodes, &Node{Name: cfg.NodeID, Config: cfg})
	}
	for _, n := range c.Nodes {
		n.Config.Join = gossip
		for _, o := range opts {
			o(&n.Config)
		}
	}
	t.Cleanup(c.StopAll)
	for i := range c.Nodes {
		c.Start(i)
	}
	// Every node must have replicated the island's first entries (the
	// backend hash is set right after the first leader's term starts).
	testutil.WaitFor(t, 20*time.Second, "all nodes to be voters under one leader", func() bool {
		l := c.Leader()
		if l < 0 {
			return false
		}
		servers, err := c.Nodes[l].Server.Node().Servers()
		if err != nil || len(servers) != size {
			return false
		}
		for _, n := range c.Nodes {
			if n.Server.Node().FSM().BackendHash() == "" {
				return false
			}
		}
		return true
	})
	return c
}

// Add starts one more server that joins the running cluster, and returns
// its index.
func (c *Cluster) Add(opts ...Option) int {
	c.t.Helper()
	cfg := testutil.Config(c.t, c.t.TempDir())
	cfg.NodeID = fmt.Sprintf("n%d", len(c.Nodes)+1)
	cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(c.t), testutil.FreeAddr(c.t), testutil.FreeAddr(c.t)
	cfg.BootstrapExpect = 0
	cfg.DeadServerTimeout = c.Nodes[0].Config.DeadServerTimeout
	cfg.LeaderWait = c.Nodes[0].Config.LeaderWait
	for _, n := range c.Nodes {
		cfg.Join = append(cfg.Join, n.Config.GossipListen)
	}
	for _, o := range opts {
		o(&cfg)
	}
	c.Nodes = append(c.Nodes, &Node{Name: cfg.NodeID, Config: cfg})
	c.Start(len(c.Nodes) - 1)
	return len(c.Nodes) - 1
}

// Start (re)starts node i with its configuration and data directory.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	n := c.Nodes[i]
	if n.Server != nil {
		return
	}
	srv, err := server.Start(n.Config, testutil.Logger(c.t),
		server.WithNetwork(c.Fabric.Network(n.Name)), server.WithGossipHook(c.Fabric.Gossip(n.Name, nil)))
	if err != nil {
		c.t.Fatalf("start %s: %v", n.Name, err)
	}
	n.Server = srv
}

// Stop shuts node i down.
func (c *Cluster) Stop(i int) {
	n := c.Nodes[i]
	if n.Server == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = n.Server.Close(ctx)
	n.Server = nil
}

// StopAll shuts every node down.
func (c *Cluster) StopAll() {
	for i := range c.Nodes {
		c.Stop(i)
	}
}

// Running lists the indexes of the running nodes.
func (c *Cluster) Running() []int {
	var out []int
	for i, n := range c.Nodes {
		if n.Server != nil {
			out = append(out, i)
		}
	}
	return out
}

// Leader returns the index of a running node that leads, or -1.
func (c *Cluster) Leader() int {
	for _, i := range c.Running() {
		if c.Nodes[i].Server.Node().IsLeader() {
			return i
		}
	}
	return -1
}

// WaitLeader waits for a leader among the running nodes.
func (c *Cluster) WaitLeader(timeout time.Duration) int {
	c.t.Helper()
	var l int
	testutil.WaitFor(c.t, timeout, "a leader", func() bool { l = c.Leader(); return l >= 0 })
	return l
}

// URL is node i's API endpoint.
func (c *Cluster) URL(i int) string { return c.Nodes[i].Server.URL() }

// Client returns a client for node i that does not retry by itself.
func (c *Cluster) Client(i int) *client.Client {
	cl, err := client.New(c.URL(i), client.WithRetry(0))
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// RetryingClient returns a client for node i that retries while the cluster
// has no leader, as applications do.
func (c *Cluster) RetryingClient(i int) *client.Client {
	cl, err := client.New(c.URL(i), client.WithRetry(15*time.Second))
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// Partition splits the nodes (by index) into groups that cannot talk.
func (c *Cluster) Partition(groups ...[]int) {
	var named [][]string
	for _, g := range groups {
		var names []string
		for _, i := range g {
			names = append(names, c.Nodes[i].Name)
		}
		named = append(named, names)
	}
	c.Fabric.Partition(named...)
}

// Heal restores every link.
func (c *Cluster) Heal() { c.Fabric.Heal() }

// Hash returns node i's applied index and state hash.
func (c *Cluster) Hash(i int) (uint64, []byte) {
	f := c.Nodes[i].Server.Node().FSM()
	var h []byte
	var idx uint64
	_ = f.View(func(v *fsm.View) error {
		h = v.Hash()
		idx = f.Applied()
		return nil
	})
	return idx, h
}

// WaitConverged waits until every running node has applied the same log
// and holds byte-identical state.
func (c *Cluster) WaitConverged(timeout time.Duration) {
	c.t.Helper()
	var detail string
	ok := func() bool {
		run := c.Running()
		idx0, h0 := c.Hash(run[0])
		for _, i := range run[1:] {
			idx, h := c.Hash(i)
			if idx != idx0 || !bytes.Equal(h, h0) {
				detail = fmt.Sprintf("%s at %d, %s at %d", c.Nodes[run[0]].Name, idx0, c.Nodes[i].Name, idx)
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			c.t.Fatalf("nodes did not converge within %s: %s", timeout, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
