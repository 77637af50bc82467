package testcluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/faultnet"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/sweeper"
)

// sweepTick is the sweeper's longest sleep in these tests.
const sweepTick = time.Second

// sweepNode is a Raft node with its sweeper wired as the server wires it,
// kept bare so that the test can watch the sweeper.
type sweepNode struct {
	name string
	node *cluster.Node
	sw   *sweeper.Sweeper
}

// lateNode lets the sweeper be built (and handed to the state machine as
// an observer) before the node it proposes through exists.
type lateNode struct{ n atomic.Pointer[cluster.Node] }

func (l *lateNode) Propose(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
	return l.n.Load().Propose(ctx, c)
}
func (l *lateNode) NextDeadline(retention int64) (int64, bool) {
	return l.n.Load().FSM().NextDeadline(retention)
}
func (l *lateNode) Now() time.Time { return l.n.Load().Now() }

func quickGossip(c *memberlist.Config) {
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = time.Second
}

// startSweepNodes starts size nodes on the fabric that bootstrap one
// cluster through gossip, and stops them when the test ends.
func startSweepNodes(t *testing.T, f *faultnet.Fabric, size int) []*sweepNode {
	t.Helper()
	var cfgs []cluster.Config
	var join []string
	for i := 0; i < size; i++ {
		name := fmt.Sprintf("s%d", i+1)
		// Internal connections and gossip are secured as a server's are.
		peer := auth.NewStaticSource(testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: name}))
		cfg := cluster.Config{NodeID: name, DataDir: t.TempDir(), RaftBind: testutil.FreeAddr(t),
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, LeaderWait: 2 * time.Second,
			Network: f.Network(name), TLS: peer, Logger: testutil.Logger(t),
			Gossip: &cluster.GossipConfig{Bind: testutil.FreeAddr(t), BootstrapExpect: size, APIEndpoint: "https://" + name,
				SecretKey: testutil.CA(t).GossipKey, DeadServerTimeout: 30 * time.Second, Tune: f.Gossip(name, quickGossip)}}
		join = append(join, cfg.Gossip.Bind)
		cfgs = append(cfgs, cfg)
	}
	var nodes []*sweepNode
	for _, cfg := range cfgs {
		cfg.Gossip.Join = join
		late := &lateNode{}
		sw := sweeper.New(late, late, late, sweeper.Config{TxnRetention: time.Minute, Idle: sweepTick, Logger: cfg.Logger})
		cfg.FSM = fsm.Options{Observers: []fsm.Observer{sw}}
		n, err := cluster.Open(cfg)
		if err != nil {
			t.Fatalf("open %s: %v", cfg.NodeID, err)
		}
		late.n.Store(n)
		n.OnLeadership(sw.SetLeader)
		t.Cleanup(func() {
			sw.Stop()
			_ = n.Close()
		})
		nodes = append(nodes, &sweepNode{name: cfg.NodeID, node: n, sw: sw})
	}
	return nodes
}

// leaseState reports whether node n knows key and whether a lease on it
// is held, as n has applied so far.
func leaseState(n *cluster.Node, key string) (known, held bool) {
	var rec fsm.KeyRecord
	_ = n.ReadStale(context.Background(), func(v *fsm.View) error { rec, known = v.Key("default", key); return nil })
	return known, rec.Lease != nil
}

// A leader cut off from the others steps down; its sweep loop has exited
// within one sweeper tick of that, and it proposes no sweep afterwards even
// though a lease falls due in its state, while the new leader sweeps it.
func TestIsolatedLeaderStopsSweeping(t *testing.T) {
	f := faultnet.New()
	nodes := startSweepNodes(t, f, 3)
	var old *sweepNode
	testutil.WaitFor(t, 20*time.Second, "a leader whose sweeper has swept", func() bool {
		for _, s := range nodes {
			if s.node.IsLeader() && s.sw.Running() && s.sw.Sweeps() > 0 {
				old = s
				return true
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := old.node.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default",
		Key: "due", Owner: "o", TxnID: "t-due", LeaseID: "l-due", RequestID: "r-due", TTL: 1500}}); err != nil {
		t.Fatal(err)
	}

	f.Isolate(old.name)
	testutil.WaitFor(t, 10*time.Second, "the isolated leader to step down", func() bool { return !old.node.IsLeader() })
	select {
	case <-old.sw.Stopped():
	case <-time.After(sweepTick):
		t.Fatalf("the sweep loop of %s still runs %s after it stepped down", old.name, sweepTick)
	}
	if old.sw.Running() {
		t.Fatal("the sweeper reports a running loop after it exited")
	}
	before := old.sw.Sweeps()

	// The majority elects a leader that sweeps the lease once it is due.
	var next *sweepNode
	testutil.WaitFor(t, 20*time.Second, "the new leader to sweep the due lease", func() bool {
		for _, s := range nodes {
			if known, held := leaseState(s.node, "due"); s != old && s.node.IsLeader() && known && !held {
				next = s
				return true
			}
		}
		return false
	})
	// The lease is due in the old leader's state too: a loop still running
	// there would have proposed a sweep by now.
	if _, held := leaseState(old.node, "due"); !held {
		t.Fatal("the isolated node applied the sweep")
	}
	when, ok := old.node.FSM().NextDeadline(time.Minute.Milliseconds())
	if !ok || when > time.Now().UnixMilli() {
		t.Fatalf("nothing due in the isolated node's state (next deadline %d, %v)", when, ok)
	}
	if got := old.sw.Sweeps(); got != before || old.sw.Running() {
		t.Fatalf("the deposed leader's sweeper went on: %d sweeps, then %d; running %v", before, got, old.sw.Running())
	}
	if next.sw.Sweeps() == 0 {
		t.Fatal("the new leader's sweeper never swept")
	}

	// After the heal, the old leader learns the outcome.
	f.Heal()
	testutil.WaitFor(t, 20*time.Second, "the healed node to apply the sweep", func() bool {
		_, held := leaseState(old.node, "due")
		return !held
	})
}
