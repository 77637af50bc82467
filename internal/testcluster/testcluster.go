// Package testcluster runs whole raftlockd nodes (HTTP API, Raft, gossip)
// inside a test process, on loopback, joined into one cluster over a
// faultnet fabric, so that tests can stop, crash, freeze and restart nodes,
// partition them, and check that the survivors converge. The nodes talk
// mutual TLS with server bundles of one CA, as a deployed cluster does.
package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/cluster"
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
	prefix string // of the nodes' names

	ca       *auth.Bundle // nil: the nodes run with --disable-mtls
	client   *auth.Bundle // a client certificate allowed every namespace
	operator *auth.Bundle // a server certificate, as an operator holds it
}

// Node is one member; Server is nil while the node is stopped.
type Node struct {
	Name   string
	Config config.Server
	Server *server.Server
	Clock  cluster.Clock // the node's own clock; nil: the wall clock
}

// Option adjusts a cluster before its nodes start.
type Option func(*settings)

type settings struct {
	ca     *auth.Bundle
	plain  bool
	fabric *faultnet.Fabric
	prefix string
	nodes  []func(*config.Server)
	clocks map[string]cluster.Clock
}

// Configure adjusts every node's configuration.
func Configure(f func(*config.Server)) Option {
	return func(s *settings) { s.nodes = append(s.nodes, f) }
}

// WithCA gives every node a server bundle of ca instead of the shared
// test CA (testutil.CA): clusters of different CAs are islands that do
// not trust each other until told to.
func WithCA(ca *auth.Bundle) Option { return func(s *settings) { s.ca = ca } }

// OnFabric runs the nodes on fabric f, which other clusters of the test
// share, named prefix1, prefix2 ...: islands whose nodes the fabric can
// partition, freeze and crash as it does the nodes of one cluster, the
// calls between them included.
func OnFabric(f *faultnet.Fabric, prefix string) Option {
	return func(s *settings) { s.fabric, s.prefix = f, prefix }
}

// WithClock runs the node named name (n1, n2 ...) on clock c instead of
// the wall clock, across restarts.
func WithClock(name string, c cluster.Clock) Option {
	return func(s *settings) {
		if s.clocks == nil {
			s.clocks = map[string]cluster.Clock{}
		}
		s.clocks[name] = c
	}
}

// WithoutTLS runs the nodes with --disable-mtls: plain HTTP, Raft and
// gossip.
func WithoutTLS() Option { return func(s *settings) { s.plain = true } }

func apply(opts []Option) settings {
	var s settings
	for _, o := range opts {
		o(&s)
	}
	return s
}

// Start runs size nodes that bootstrap one cluster and waits until every
// node is a voter and a leader serves. The nodes stop when the test ends.
func Start(t testing.TB, size int, opts ...Option) *Cluster {
	t.Helper()
	set := apply(opts)
	c := &Cluster{t: t, Fabric: set.fabric, prefix: set.prefix}
	if c.Fabric == nil {
		c.Fabric, c.prefix = faultnet.New(), "n"
	}
	if !set.plain {
		c.ca = set.ca
		if c.ca == nil {
			c.ca = testutil.CA(t)
		}
		c.client = testutil.ClientBundleOf(t, c.ca)
		c.operator = testutil.OperatorBundle(t, c.ca)
	}
	var gossip []string
	for i := 0; i < size; i++ {
		cfg := testutil.Config(t, t.TempDir())
		cfg.NodeID = fmt.Sprintf("%s%d", c.prefix, i+1)
		cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
		cfg.BootstrapExpect = size
		cfg.DeadServerTimeout = 30 * time.Second
		cfg.LeaderWait = 2 * time.Second
		gossip = append(gossip, cfg.GossipListen)
		c.Nodes = append(c.Nodes, &Node{Name: cfg.NodeID, Config: cfg, Clock: set.clocks[cfg.NodeID]})
	}
	for _, n := range c.Nodes {
		n.Config.Join = gossip
		c.secure(&n.Config)
		for _, f := range set.nodes {
			f(&n.Config)
		}
	}
	t.Cleanup(c.StopAll)
	for i := range c.Nodes {
		c.Start(i)
	}
	// Every node must have replicated the island's first entries (the
	// backend hash is set right after the first leader's term starts).
	testutil.WaitFor(t, 30*time.Second, "all nodes to be voters under one leader", func() bool {
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

// secure gives the node a server bundle of the cluster's CA, valid for
// the address its API listens on, or turns mTLS off.
func (c *Cluster) secure(cfg *config.Server) {
	c.t.Helper()
	if c.ca == nil {
		cfg.DisableMTLS = true
		return
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.Bundle = testutil.ServerBundle(c.t, cfg.DataDir, c.ca, host)
}

// CA is the cluster's CA; nil when the nodes run without TLS.
func (c *Cluster) CA() *auth.Bundle { return c.ca }

// Add starts one more server that joins the running cluster, and returns
// its index. Options other than Configure are the cluster's and ignored.
func (c *Cluster) Add(opts ...Option) int {
	c.t.Helper()
	cfg := testutil.Config(c.t, c.t.TempDir())
	cfg.NodeID = fmt.Sprintf("%s%d", c.prefix, len(c.Nodes)+1)
	cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(c.t), testutil.FreeAddr(c.t), testutil.FreeAddr(c.t)
	cfg.BootstrapExpect = 0
	cfg.DeadServerTimeout = c.Nodes[0].Config.DeadServerTimeout
	cfg.LeaderWait = c.Nodes[0].Config.LeaderWait
	for _, n := range c.Nodes {
		cfg.Join = append(cfg.Join, n.Config.GossipListen)
	}
	c.secure(&cfg)
	for _, f := range apply(opts).nodes {
		f(&cfg)
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
	// Clients that dial through the fabric (Client, HTTPClient) are
	// subject to the node's freezes and crashes.
	c.Fabric.Register(n.Config.Listen, n.Name)
	opts := []server.Option{server.WithNetwork(c.Fabric.Network(n.Name)),
		server.WithPeerDialer(c.Fabric.Dialer(n.Name)), server.WithGossipHook(c.Fabric.Gossip(n.Name, nil))}
	if n.Clock != nil {
		opts = append(opts, server.WithClock(n.Clock))
	}
	srv, err := server.Start(n.Config, testutil.Logger(c.t), opts...)
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

// Crash kills node i as a crashed process dies: its peers and clients
// lose every connection to it at once (no answers to requests in flight,
// no draining, no leadership hand-off, no goodbye on gossip), dials to it
// are refused, and its parts are torn down without the clean-close marker
// on the state file. Start restarts it from its data directory.
func (c *Cluster) Crash(i int) { c.crash(i, false) }

// PowerOff crashes node i as Crash does and its host with it: on restart
// the state file (written without fsync) is not trusted and is rebuilt
// from the Raft snapshot and log, which were synced.
func (c *Cluster) PowerOff(i int) { c.crash(i, true) }

func (c *Cluster) crash(i int, rebooted bool) {
	n := c.Nodes[i]
	if n.Server == nil {
		return
	}
	c.Fabric.Kill(n.Name)
	_ = n.Server.Crash()
	n.Server = nil
	if err := fsm.MarkCrashed(filepath.Join(n.Config.DataDir, "state.db"), rebooted); err != nil {
		c.t.Errorf("crash %s: %v", n.Name, err)
	}
	c.Fabric.Revive(n.Name)
}

// Freeze pauses node i as far as everyone else can tell (see
// faultnet.Fabric.Freeze): nothing it sends arrives and nothing sent to it
// is read, including requests of clients that dial through the fabric,
// until Thaw.
func (c *Cluster) Freeze(i int) { c.Fabric.Freeze(c.Nodes[i].Name) }

// Thaw ends node i's freeze; whatever was held is delivered.
func (c *Cluster) Thaw(i int) { c.Fabric.Thaw(c.Nodes[i].Name) }

// StopAll heals every link, thaws every node and shuts every node down.
func (c *Cluster) StopAll() {
	c.Fabric.Heal()
	for _, n := range c.Nodes {
		c.Fabric.Thaw(n.Name)
	}
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

// WaitRules waits until every running node's state machine follows this
// build's entry format rules (fsm.EntryFormat). A new island follows the
// oldest rules until gossip shows that every server applies this build's
// format and the leader's sweeper raises them.
func (c *Cluster) WaitRules(timeout time.Duration) {
	c.t.Helper()
	testutil.WaitFor(c.t, timeout, "every node to follow this build's rules", func() bool {
		for _, i := range c.Running() {
			if c.Nodes[i].Server.Node().FSM().Rules() < fsm.EntryFormat {
				return false
			}
		}
		return true
	})
}

// URL is node i's API endpoint.
func (c *Cluster) URL(i int) string { return c.Nodes[i].Server.URL() }

// HTTPClient returns an HTTP client, named name on the fabric, that dials
// the nodes through the fabric, presents a client certificate of the
// cluster's CA allowed every namespace and trusts that CA.
func (c *Cluster) HTTPClient(name string) *http.Client { return c.httpClient(name, c.client) }

// OperatorHTTPClient is HTTPClient presenting a server certificate of the
// cluster's CA, as an operator on a node does: it may call the
// administrative endpoints too.
func (c *Cluster) OperatorHTTPClient(name string) *http.Client { return c.httpClient(name, c.operator) }

func (c *Cluster) httpClient(name string, b *auth.Bundle) *http.Client {
	t := &http.Transport{DialContext: c.Fabric.Dialer(name), MaxIdleConnsPerHost: 256,
		IdleConnTimeout: 90 * time.Second, ExpectContinueTimeout: time.Second}
	if b != nil {
		t.TLSClientConfig = auth.ClientConfig(b)
	}
	return &http.Client{Transport: t}
}

// Client returns a client for node i that does not retry by itself.
func (c *Cluster) Client(i int) *client.Client { return c.sdk(i, 0, c.HTTPClient("client")) }

// RetryingClient returns a client for node i that retries while the cluster
// has no leader, as applications do.
func (c *Cluster) RetryingClient(i int) *client.Client {
	return c.sdk(i, 15*time.Second, c.HTTPClient("client"))
}

// Operator returns a client for node i that presents a server certificate
// (see OperatorHTTPClient) and does not retry by itself.
func (c *Cluster) Operator(i int) *client.Client {
	return c.sdk(i, 0, c.OperatorHTTPClient("operator"))
}

func (c *Cluster) sdk(i int, retry time.Duration, h *http.Client) *client.Client {
	cl, err := client.New(c.URL(i), client.WithRetry(retry), client.WithHTTPClient(h))
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
	if err := c.Converged(timeout); err != nil {
		c.t.Fatal(err)
	}
}

// Converged is WaitConverged reporting failure as an error.
func (c *Cluster) Converged(timeout time.Duration) error {
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
			return errors.New("nodes did not converge within " + timeout.String() + ": " + detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
