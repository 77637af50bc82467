package cluster

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// startStatic starts n nodes on loopback and bootstraps them as one
// cluster; configure, when given, changes each node's configuration.
func startStatic(t *testing.T, count int, configure ...func(*Config)) []*Node {
	t.Helper()
	dirs, addrs := make([]string, count), make([]string, count)
	for i := range dirs {
		dirs[i], addrs[i] = t.TempDir(), "127.0.0.1:0"
	}
	return startStaticAt(t, "boot-a", dirs, addrs, configure...)
}

// startStaticAt starts a cluster of len(addrs) voters on the Raft
// addresses given, in dirs.
func startStaticAt(t *testing.T, boot string, dirs, addrs []string, configure ...func(*Config)) []*Node {
	t.Helper()
	var nodes []*Node
	for i := range dirs {
		cfg := testConfig(dirs[i], boot)
		cfg.NodeID = "n" + strconv.Itoa(i+1)
		cfg.Bootstrap = false
		cfg.RaftBind = addrs[i]
		for _, c := range configure {
			c(&cfg)
		}
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	bootstrapAll(t, nodes)
	leaderOf(t, nodes)
	return nodes
}

// reopen starts, on dir, a server with like's id and Raft address (like
// having stopped), whose state machine stops with fatal (nil: the
// default).
func reopen(t *testing.T, dir string, like *Node, fatal func(error)) *Node {
	t.Helper()
	cfg := testConfig(dir, "boot-a")
	cfg.NodeID, cfg.Bootstrap, cfg.RaftBind, cfg.FSM.Fatal = like.ID(), false, like.RaftAddr(), fatal
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// bootstrapAll makes nodes the voters of a new cluster, bootstrapped on
// every one of them (each is a founder).
func bootstrapAll(t *testing.T, nodes []*Node) {
	t.Helper()
	var servers []raft.Server
	for _, n := range nodes {
		servers = append(servers, raft.Server{ID: raft.ServerID(n.ID()), Address: raft.ServerAddress(n.RaftAddr()), Suffrage: raft.Voter})
	}
	for _, n := range nodes {
		if err := n.Bootstrap(servers); err != nil {
			t.Fatal(err)
		}
	}
}

func leaderOf(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n.IsLeader() && n.readyTerm.Load() == n.raft.CurrentTerm() {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

func followers(nodes []*Node, leader *Node) []*Node {
	var out []*Node
	for _, n := range nodes {
		if n != leader {
			out = append(out, n)
		}
	}
	return out
}

func hasKey(t *testing.T, n *Node, key string) bool {
	t.Helper()
	var ok bool
	if err := n.Read(context.Background(), func(v *fsm.View) error { _, ok = v.Key("default", key); return nil }); err != nil {
		t.Fatalf("read on %s: %v", n.ID(), err)
	}
	return ok
}

func TestFollowersForwardWritesAndServeLinearizableReads(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	fs := followers(nodes, leader)
	for i := 0; i < 20; i++ {
		key := "f-" + strconv.Itoa(i)
		// Write through one follower, read through the other: the read must
		// see the acknowledged write.
		acquire(t, fs[i%2], key)
		if !hasKey(t, fs[(i+1)%2], key) {
			t.Fatalf("follower read missed acknowledged write %s", key)
		}
	}
	// A rejected command comes back through the forwarding path intact.
	_, err := fs[0].Propose(context.Background(), &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: "f-0", Owner: "o", TxnID: "other", LeaseID: "l2", RequestID: "r2", TTL: 1000}})
	var e *errcode.Error
	if !errors.As(err, &e) || e.Code != errcode.Waiting.Code || e.RetryAfter == 0 {
		t.Fatalf("forwarded rejection: %v", err)
	}
	st, err := fs[0].PeerStatus(context.Background(), leader.RaftAddr())
	if err != nil || st.State != "Leader" || st.NodeID != leader.ID() {
		t.Fatalf("peer status %+v %v", st, err)
	}
}

func TestWritesContinueAfterTheLeaderStops(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	acquire(t, leader, "before")
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	rest := followers(nodes, leader)
	next := leaderOf(t, rest)
	if next == leader {
		t.Fatal("stopped node still leads")
	}
	for _, n := range rest {
		acquire(t, n, "after-"+n.ID())
	}
	for _, n := range rest {
		for _, key := range []string{"before", "after-" + rest[0].ID(), "after-" + rest[1].ID()} {
			if !hasKey(t, n, key) {
				t.Fatalf("%s lacks %s", n.ID(), key)
			}
		}
	}
}

// A server back from an absence gets the entries it missed at once. Raft
// waits longer after every request that did not reach a server (up to
// 10 s), so after a few seconds away the server would wait seconds more
// for its first entry, and a cluster that then lost another server would
// have no quorum for that long (a rolling restart).
func TestAServerBackFromAnAbsenceGetsEntriesAtOnce(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStaticAt(t, "boot-a", dirs, []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"})
	leader := leaderOf(t, nodes)
	gone := followers(nodes, leader)[0]
	dir := dirs[slices.Index(nodes, gone)]
	term := leader.raft.CurrentTerm()
	for _, c := range []struct {
		n    *Node
		id   string
		term uint64
		want bool
	}{{leader, gone.ID(), term, true}, {leader, "n9", term, false}, {leader, gone.ID(), term + 1, false},
		{followers(nodes, leader)[1], gone.ID(), term, false}} {
		if got := c.n.replicatesTo(raft.ServerID(c.id), c.term); got != c.want {
			t.Fatalf("%s replicates to %s in term %d: %v", c.n.ID(), c.id, c.term, got)
		}
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	acquire(t, leader, "while-away")
	// The absence: long enough for raft's wait between attempts to grow
	// past two seconds.
	time.Sleep(6 * time.Second)
	back := reopen(t, dir, gone, nil)
	start := time.Now()
	for {
		var ok bool
		_ = back.FSM().View(func(v *fsm.View) error { _, ok = v.Key("default", "while-away"); return nil })
		if ok {
			break
		}
		if took := time.Since(start); took > 1500*time.Millisecond {
			t.Fatalf("the server had not got the entries it missed %v after it came back", took.Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the server got the entries it missed %v after it came back", time.Since(start).Round(time.Millisecond))
}

// A follower counts as behind (and its /readyz says so) while more than
// readySlack entries of the commit index its leader sent are left to apply;
// a leader never is.
func TestAFollowerFarFromItsLeadersCommitIsBehind(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	acquire(t, leader, "k")
	f := followers(nodes, leader)[0]
	deadline := time.Now().Add(10 * time.Second)
	for {
		applied, commit, behind := f.Behind()
		if !behind && applied >= leader.FSM().Applied() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower stays behind: applied %d of %d", applied, commit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, behind := leader.Behind(); behind {
		t.Fatal("the leader is behind")
	}
	applied := f.FSM().Applied()
	term := f.raft.CurrentTerm()
	for _, c := range []struct {
		sent   *leaderCommit
		behind bool
	}{{&leaderCommit{term: term, index: applied + readySlack + 1}, true},
		{&leaderCommit{term: term, index: applied + readySlack}, false}} {
		// (The leader's own requests carry lower indexes: they leave these.)
		f.transport.commit.Store(c.sent)
		if a, commit, behind := f.Behind(); behind != c.behind || a != applied {
			t.Fatalf("sent %+v: applied %d of %d, behind %v", c.sent, a, commit, behind)
		}
	}
}
