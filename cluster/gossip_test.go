package cluster

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testaddr"
)

func freeAddr(t *testing.T) string { return testaddr.Free(t) }

// fastGossip makes failure detection take a fraction of a second.
func fastGossip(c *memberlist.Config) {
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.GossipInterval = 20 * time.Millisecond
	c.SuspicionMult = 1
	c.PushPullInterval = time.Second
	c.TCPTimeout = 500 * time.Millisecond
	c.GossipToTheDeadTime = 2 * time.Second
	c.DeadNodeReclaimTime = 100 * time.Millisecond
}

type gossipNode struct {
	cfg Config
	n   *Node
}

func gossipConfig(t *testing.T, id string, expect int, join []string) Config {
	cfg := testConfig(t.TempDir(), "boot-a")
	cfg.NodeID = id
	cfg.Bootstrap = false
	cfg.RaftBind = freeAddr(t)
	cfg.Gossip = &GossipConfig{Bind: freeAddr(t), Join: join, BootstrapExpect: expect, APIEndpoint: "https://" + id,
		SecretKey:         testCA().GossipKey,
		DeadServerTimeout: time.Second, ServerStabilization: 200 * time.Millisecond, PilotInterval: 100 * time.Millisecond,
		Tune: fastGossip}
	return cfg
}

func openNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func voters(t *testing.T, n *Node) map[string]bool {
	t.Helper()
	servers, err := n.Servers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range servers {
		out[string(s.ID)] = s.Suffrage == raft.Voter
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGossipBootstrapsOneClusterAndManagesVoters(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	// Started one by one, as an operator would: nothing bootstraps until
	// all three see each other.
	for i, cfg := range cfgs {
		nodes = append(nodes, openNode(t, cfg))
		if i < 2 {
			time.Sleep(300 * time.Millisecond)
			for _, n := range nodes {
				if n.HasState() {
					t.Fatalf("%s bootstrapped with only %d servers up", n.ID(), len(nodes))
				}
			}
		}
	}
	leader := leaderOf(t, nodes)
	if n := bootstraps(nodes); n != 1 {
		t.Fatalf("%d nodes bootstrapped, want exactly 1", n)
	}
	if v := voters(t, leader); len(v) != 3 || !v["n1"] || !v["n2"] || !v["n3"] {
		t.Fatalf("voters %v", v)
	}
	// Every node publishes the island's backend hash and the API endpoints.
	waitFor(t, 5*time.Second, "metadata to spread", func() bool {
		for _, n := range nodes {
			for _, m := range n.Members() {
				if m.Backend == "" || m.Backend != leader.fsm.BackendHash() || m.API != "https://"+m.ID || !m.meta.Island ||
					n.gossip.olderBuildAt(m.RaftAddr) {
					return false
				}
			}
		}
		return true
	})

	// A fourth server joins; the leader adds it and promotes it once stable.
	fourth := gossipConfig(t, "n4", 0, join)
	n4 := openNode(t, fourth)
	waitFor(t, 10*time.Second, "n4 to become a voter", func() bool { return voters(t, leader)["n4"] })
	acquire(t, n4, "via-n4")

	// It stops for good; after the dead-server timeout the leader removes it.
	if err := n4.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "dead n4 to be removed", func() bool {
		_, ok := voters(t, leaderOf(t, nodes))["n4"]
		return !ok
	})
	if v := voters(t, leaderOf(t, nodes)); len(v) != 3 {
		t.Fatalf("voters after cleanup %v", v)
	}
}

func TestRestartedNodeRejoinsWithoutHelp(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	for _, cfg := range cfgs {
		nodes = append(nodes, openNode(t, cfg))
	}
	leader := leaderOf(t, nodes)
	var victim int
	for i, n := range nodes {
		if n != leader {
			victim = i
		}
	}
	if err := nodes[victim].Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		acquire(t, leader, "while-down-"+strconv.Itoa(i))
	}
	// Same data dir, same flags (including the bootstrap expectation).
	back := openNode(t, cfgs[victim])
	waitFor(t, 10*time.Second, "the restarted node to catch up", func() bool {
		ok := false
		_ = back.ReadStale(context.Background(), func(v *fsm.View) error { _, ok = v.Key("default", "while-down-9"); return nil })
		return ok
	})
	if back.gossip.bootstrapped.Load() {
		t.Fatal("a restarted node bootstrapped again")
	}
	if v := voters(t, leader); len(v) != 3 || !v[back.ID()] {
		t.Fatalf("voters after restart %v", v)
	}
}

// UseGossipKey sends with the key it is given, reads the accepted ones as
// well, and stops reading every other key.
func TestUseGossipKeyKeepsOnlyTheNamedKeys(t *testing.T) {
	cfg := gossipConfig(t, "keys", 0, nil)
	old, next := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	cfg.Gossip.SecretKey, cfg.Gossip.AcceptKeys = old, [][]byte{next}
	n := openNode(t, cfg)
	kr := n.gossip.keyring
	keys := func() int { return len(kr.GetKeys()) }
	if !bytes.Equal(kr.GetPrimaryKey(), old) || keys() != 2 {
		t.Fatalf("at start: %d keys", keys())
	}
	if err := n.UseGossipKey(next, old); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kr.GetPrimaryKey(), next) || keys() != 2 {
		t.Fatalf("switched with the old key accepted: %d keys", keys())
	}
	if err := n.UseGossipKey(next); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kr.GetPrimaryKey(), next) || keys() != 1 {
		t.Fatalf("the old key dropped: %d keys", keys())
	}
	// Without a key, gossip stays encrypted with the one it has, and says so.
	if err := n.UseGossipKey(nil); !errors.Is(err, ErrGossipKeyKept) || !bytes.Equal(kr.GetPrimaryKey(), next) || keys() != 1 {
		t.Fatalf("a bundle without a gossip key: %v, %d keys", err, keys())
	}
}

// Gossip that started unencrypted says a new key takes a restart.
func TestUnencryptedGossipSaysAKeyNeedsARestart(t *testing.T) {
	cfg := gossipConfig(t, "plain", 0, nil)
	cfg.Gossip.SecretKey = nil
	n := openNode(t, cfg)
	if err := n.UseGossipKey(nil); err != nil {
		t.Fatalf("no key for unencrypted gossip: %v", err)
	}
	if err := n.UseGossipKey(bytes.Repeat([]byte{1}, 32)); !errors.Is(err, ErrGossipKeyKept) || n.gossip.keyring != nil {
		t.Fatalf("a key for unencrypted gossip: %v", err)
	}
}

// The same --join list on every server names the server itself: its own
// address answering is no join, and it keeps trying the others until one
// answers, even when none of them ever joins it in turn.
func TestAJoinListWithItselfKeepsTryingTheOthers(t *testing.T) {
	a, b := gossipConfig(t, "a", 2, nil), gossipConfig(t, "b", 2, nil)
	b.Gossip.Join = []string{a.Gossip.Bind, b.Gossip.Bind} // a joins nobody
	nb := openNode(t, b)
	time.Sleep(time.Second) // b tries while a is not up yet
	na := openNode(t, a)
	waitFor(t, 15*time.Second, "a and b to meet and bootstrap", func() bool { return na.HasState() && nb.HasState() })

	// A list that names only the server itself is nobody to wait for.
	c := gossipConfig(t, "c", 1, nil)
	c.Gossip.Join = []string{c.Gossip.Bind}
	nc := openNode(t, c)
	waitFor(t, 10*time.Second, "c to bootstrap alone", nc.HasState)
}

// A server started under the id of one that runs (the same --node-id, or
// a copy of its data directory) stops, saying why; the one that ran
// first goes on, and the cluster keeps its leader.
func TestAServerStartedUnderARunningServersIDStops(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	halted := make([]chan error, len(cfgs)+1)
	var nodes []*Node
	for i := range cfgs {
		halted[i] = make(chan error, 1)
		cfgs[i].FSM.Fatal = func(err error) {
			select {
			case halted[i] <- err:
			default:
			}
		}
		nodes = append(nodes, openNode(t, cfgs[i]))
	}
	leader := leaderOf(t, nodes)
	acquire(t, leader, "before")
	waitApplied(t, nodes[0], leader.fsm.Applied())

	twin := gossipConfig(t, "n1", 3, join)
	halted[3] = make(chan error, 1)
	twin.FSM.Fatal = func(err error) {
		select {
		case halted[3] <- err:
		default:
		}
	}
	openNode(t, twin)
	select {
	case err := <-halted[3]:
		if !strings.Contains(err.Error(), "another server already runs under this node's id n1") {
			t.Fatalf("the twin stopped with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a second server under n1's id kept running")
	}
	for i := range cfgs {
		select {
		case err := <-halted[i]:
			t.Fatalf("%s stopped: %v", nodes[i].ID(), err)
		default:
		}
	}
	acquire(t, leaderOf(t, nodes), "after")
}
