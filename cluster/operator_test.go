package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// A server removed while it keeps running is not added back by the
// leader's membership loop; once it restarts it is.
func TestRemovedServerStaysOutUntilItRestarts(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	for _, cfg := range cfgs {
		nodes = append(nodes, openNode(t, cfg))
	}
	leader := leaderOf(t, nodes)
	victim := followers(nodes, leader)[0]
	ctx := context.Background()
	if err := victim.RemovePeer(ctx, victim.ID()); err != nil {
		t.Fatal(err)
	}
	if _, ok := voters(t, leader)[victim.ID()]; ok {
		t.Fatalf("%s still in the configuration after its removal", victim.ID())
	}
	// Gossip still sees it alive; reconciliation passes do not add it back.
	for range 3 {
		leader.gossip.pilot.addNewServers()
	}
	if _, ok := leader.gossip.pilot.KnownServers()[raft.ServerID(victim.ID())]; ok {
		t.Fatal("autopilot is told about the removed server")
	}
	if _, ok := voters(t, leader)[victim.ID()]; ok {
		t.Fatal("the leader added the removed server back while it runs")
	}
	if err := leader.RemovePeer(ctx, victim.ID()); !errors.Is(err, errcode.NotFound) {
		t.Fatalf("removing it again: %v, want not_found", err)
	}

	// Restarted with the same data dir, it joins again and is added back.
	var cfg Config
	for i, n := range nodes {
		if n == victim {
			cfg = cfgs[i]
		}
	}
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	back := openNode(t, cfg)
	waitFor(t, 15*time.Second, "the restarted server to be a voter again", func() bool { return voters(t, leaderOf(t, nodes))[back.ID()] })
}

// The only voter can neither leave nor be removed.
func TestLastVoterCannotLeave(t *testing.T) {
	n := open(t, testConfig(t.TempDir(), "boot-a"))
	defer n.Close()
	left := false
	n.OnLeft(func() { left = true })
	if err := n.Leave(context.Background()); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("leave: %v, want last_voter", err)
	}
	if err := n.RemovePeer(context.Background(), n.ID()); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("remove-peer: %v, want last_voter", err)
	}
	if left || !n.IsLeader() {
		t.Fatalf("after refused leave: left %v, leader %v", left, n.IsLeader())
	}
}

// A leader asked to remove itself hands its leadership over and is removed
// by the next one, without shutting raft down under the proposals it
// serves: the removal and every proposal are answered, and the old leader
// closes cleanly.
func TestRemovedLeaderStepsDownAndAnswersEveryProposal(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	const proposers = 8
	stop, answered := make(chan struct{}), make(chan struct{}, proposers)
	for range proposers {
		go func() {
			defer func() { answered <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = leader.Propose(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}})
				cancel()
			}
		}()
	}
	removed := make(chan error, 1)
	go func() { removed <- leader.RemovePeer(context.Background(), leader.ID()) }()
	deadline := time.After(20 * time.Second)
	select {
	case err := <-removed:
		if err != nil {
			t.Fatalf("removing the leader: %v", err)
		}
	case <-deadline:
		t.Fatal("the leader's removal of itself was never answered")
	}
	close(stop)
	for i := range proposers {
		select {
		case <-answered:
		case <-deadline:
			t.Fatalf("%d of %d proposers still wait on the removed leader", proposers-i, proposers)
		}
	}
	if st := leader.raft.State(); st == raft.Shutdown {
		t.Fatal("raft shut down on the removed leader")
	}
	next := leaderOf(t, followers(nodes, leader))
	acquire(t, next, "after-removal")
	if _, ok := voters(t, next)[leader.ID()]; ok {
		t.Fatal("the removed leader is still a voter")
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
}

// A leader removed with remove-peer while it keeps running stays out: the
// next leader, not the removed one, takes it out and remembers doing so.
func TestRemovedLeaderStaysOutWhileItRuns(t *testing.T) {
	nodes := openAll(t, sameFlags(t, []string{"n1", "n2", "n3"}, 3))
	leader := leaderWithin(t, nodes)
	rest := followers(nodes, leader)
	// A removal cut short by a leadership change is asked for again; one
	// that went through then answers not_found.
	waitFor(t, 20*time.Second, "the leader's removal", func() bool {
		err := rest[0].RemovePeer(context.Background(), leader.ID())
		return err == nil || errors.Is(err, errcode.NotFound)
	})
	next := leaderWithin(t, rest)
	for range 3 {
		next.gossip.pilot.addNewServers()
	}
	if _, ok := next.gossip.pilot.KnownServers()[raft.ServerID(leader.ID())]; ok {
		t.Fatal("autopilot is told about the removed leader")
	}
	if v := voters(t, next); len(v) != 2 {
		t.Fatalf("configuration after removing the leader %s: %v", leader.ID(), v)
	}
	acquire(t, next, "after-removing-the-leader")
}

// A server removed while it keeps running stays out after the leader that
// removed it hands its leadership over: every node remembers the removals
// it sees in the configuration.
func TestRemovedServerStaysOutAfterALeaderChange(t *testing.T) {
	nodes := openAll(t, sameFlags(t, []string{"n1", "n2", "n3"}, 3))
	leader := leaderWithin(t, nodes)
	victim, other := followers(nodes, leader)[0], followers(nodes, leader)[1]
	waitFor(t, 10*time.Second, "every node to have looked at the configuration", func() bool {
		for _, n := range nodes {
			n.gossip.mu.Lock()
			_, seen := n.gossip.config[victim.ID()]
			n.gossip.mu.Unlock()
			if !seen {
				return false
			}
		}
		return true
	})
	if err := leader.RemovePeer(context.Background(), victim.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the removal to reach the other follower", func() bool {
		_, ok := voters(t, other)[victim.ID()]
		return !ok
	})
	if err := leader.transferLeadership(); err != nil {
		t.Fatalf("handing leadership over: %v", err)
	}
	next := leaderWithin(t, []*Node{leader, other})
	for range 3 {
		next.gossip.pilot.addNewServers()
	}
	if _, ok := next.gossip.pilot.KnownServers()[raft.ServerID(victim.ID())]; ok {
		t.Fatalf("autopilot on %s is told about the removed server", next.ID())
	}
	if _, ok := voters(t, next)[victim.ID()]; ok {
		t.Fatalf("%s added the removed server back while it runs", next.ID())
	}
}

// A member's row shows the Raft state only of the server it names: a
// process of another id now listening at its address is reported, not
// shown as that member.
func TestMemberRowsShowOnlyTheirOwnServersState(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	gone := followers(nodes, leader)[0]
	addr := gone.RaftAddr()
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t.TempDir(), "boot-x")
	cfg.NodeID, cfg.RaftBind, cfg.Bootstrap = "x", addr, false
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })

	members, err := leader.MemberStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.ID != gone.ID() {
			if m.Status == nil || m.Status.NodeID != m.ID {
				t.Fatalf("row %s: %+v", m.ID, m)
			}
			continue
		}
		if m.Status != nil || m.Err == nil || !strings.Contains(m.Err.Error(), "answers as x") {
			t.Fatalf("the row of %s shows another server: status %+v, error %v", m.ID, m.Status, m.Err)
		}
	}
}

// A server removed and restarted before a node noticed the removal counts
// as rejoined on that node too: its removal is of the run the
// configuration held, and gossip already announces the next one.
func TestARemovalNoticedAfterTheRestartDoesNotKeepTheServerOut(t *testing.T) {
	g := &gossip{members: map[string]*Member{}, removed: map[string]string{}, pilot: &pilot{kickCh: make(chan struct{}, 1)}}
	announce := func(id, run string) {
		meta, err := json.Marshal(memberMeta{ID: id, Run: run})
		if err != nil {
			t.Fatal(err)
		}
		g.NotifyUpdate(&memberlist.Node{Name: id, Meta: meta})
	}
	servers := func(ids ...string) []raft.Server {
		var out []raft.Server
		for _, id := range ids {
			out = append(out, raft.Server{ID: raft.ServerID(id)})
		}
		return out
	}
	announce("a", "a1")
	announce("b", "b1")
	announce("c", "c1")
	g.noteConfig(servers("a", "b", "c"))

	// b is removed while it runs: it stays out.
	g.noteConfig(servers("a", "c"))
	if !g.wasRemoved("b") {
		t.Fatal("a server removed while it runs counts as rejoined")
	}
	// c is removed and restarts; this node hears of the restart first.
	announce("c", "c2")
	g.noteConfig(servers("a"))
	if g.wasRemoved("c") {
		t.Fatal("a server that restarted after its removal is kept out")
	}
	// b restarts: it rejoins.
	announce("b", "b2")
	if g.wasRemoved("b") {
		t.Fatal("a removed server that restarted is kept out")
	}
}

// A server that has not joined a cluster yet (its --join reaches nobody)
// is in no Raft configuration: a leave says so at once, instead of
// looking for a leader to remove it until the caller gives up, and the
// server keeps running.
func TestALeaveOfAServerThatHasNotJoinedSaysSo(t *testing.T) {
	n := openNode(t, gossipConfig(t, "lone", 0, []string{freeAddr(t)}))
	left := false
	n.OnLeft(func() { left = true })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := n.Leave(ctx)
	if !errors.Is(err, errcode.NotFound) || time.Since(start) > 2*time.Second {
		t.Fatalf("leave of a server that has not joined: %v after %s, want not_found at once", err, time.Since(start))
	}
	if left {
		t.Fatal("a server that has not joined shut down as if it had left")
	}
}

// A leave on a server of a cluster that has lost its quorum answers
// no_leader once no leader came within the leader wait, as every request
// does, instead of looking for one until the caller gives up; the server
// keeps running.
func TestALeaveWithoutAQuorumAnswersNoLeader(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderWithin(t, nodes)
	for _, f := range followers(nodes, leader) {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the leader to step down", func() bool { return !leader.HasLeader() })
	left := false
	leader.OnLeft(func() { left = true })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := leader.Leave(ctx)
	if !errors.Is(err, errcode.NoLeader) || time.Since(start) > leader.cfg.LeaderWait+5*time.Second {
		t.Fatalf("leave without a quorum: %v after %s, want no_leader within the leader wait", err, time.Since(start))
	}
	if left {
		t.Fatal("a server that could not leave shut down as if it had")
	}
}
