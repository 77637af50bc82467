package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

// waitDone waits until srv has shut itself down.
func waitDone(t *testing.T, srv *server.Server, what string) {
	t.Helper()
	select {
	case <-srv.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: server still running 20s after leaving", what)
	}
}

// servers is the Raft configuration as node i sees it.
func (c *Cluster) servers(i int) []raft.Server {
	c.t.Helper()
	s, err := c.Nodes[i].Server.Node().Servers()
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

func voters(servers []raft.Server) []string {
	var ids []string
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			ids = append(ids, string(s.ID))
		}
	}
	slices.Sort(ids)
	return ids
}

// Members lists every server with the Raft status that server reports; a
// server that cannot be reached shows an error instead of failing the call.
func TestMembersShowEveryNodesOwnStatus(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	f := others(c, l)[0]

	m, err := c.Operator(f).ClusterMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.LeaderID != c.Nodes[l].Name || m.LeaderEndpoint != c.URL(l) || len(m.Members) != 3 {
		t.Fatalf("members: %+v", m)
	}
	for i, mem := range m.Members {
		n := c.Nodes[i]
		if mem.ID != n.Name || mem.Suffrage != "voter" || mem.GossipStatus != "alive" || mem.APIEndpoint != c.URL(i) ||
			mem.RaftAddr != n.Server.Node().RaftAddr() || mem.Raft == nil || mem.Error != "" {
			t.Fatalf("member %d: %+v", i, mem)
		}
		wantState := "Follower"
		if i == l {
			wantState = "Leader"
		}
		if mem.Leader != (i == l) || mem.Raft.State != wantState || mem.Raft.Term == 0 || mem.Raft.AppliedIndex == 0 ||
			mem.Raft.CommitIndex == 0 {
			t.Fatalf("member %s reports %+v (leader %v)", mem.ID, mem.Raft, mem.Leader)
		}
	}

	st, err := c.Operator(f).ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeID != c.Nodes[f].Name || st.State != "Follower" || st.LeaderID != c.Nodes[l].Name ||
		st.LeaderEndpoint != c.URL(l) || st.Term == 0 {
		t.Fatalf("status of %s: %+v", c.Nodes[f].Name, st)
	}
	resp, err := c.OperatorHTTPClient("operator").Get(c.URL(f) + "/v1/cluster/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get(wire.HeaderServedBy) != c.Nodes[f].Name || resp.Header.Get(wire.HeaderLeader) != c.Nodes[l].Name {
		t.Fatalf("headers of a follower's answer: %v", resp.Header)
	}

	down := others(c, l, f)[0]
	c.Stop(down)
	m, err = c.Operator(f).ClusterMembers(ctx)
	if err != nil {
		t.Fatalf("members with %s down: %v", c.Nodes[down].Name, err)
	}
	for i, mem := range m.Members {
		if reachable := i != down; (mem.Raft != nil) != reachable || (mem.Error == "") != reachable {
			t.Fatalf("with %s down, member %s: raft %+v, error %q", c.Nodes[down].Name, mem.ID, mem.Raft, mem.Error)
		}
	}

	// A server that crashed and came back since it was last asked answers
	// the first time: the connection that died with it is replaced.
	answers := func() bool {
		m, err := c.Operator(f).ClusterMembers(ctx)
		return err == nil && m.Members[down].Raft != nil && m.Members[down].Error == ""
	}
	c.Start(down)
	testutil.WaitFor(t, 20*time.Second, "the restarted server to answer", answers)
	c.Crash(down)
	c.Start(down)
	c.WaitConverged(20 * time.Second)
	if !answers() {
		t.Fatalf("%s, restarted, is reported unreachable", c.Nodes[down].Name)
	}
}

// remove-peer takes a dead server out of the configuration without waiting
// for the dead-server timeout; an unknown id is not_found.
func TestRemovePeer(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	victim, via := others(c, l)[0], others(c, l)[1]
	c.Stop(victim)

	out, err := c.Operator(via).RemovePeer(ctx, c.Nodes[victim].Name)
	if err != nil || !out.Removed || out.Running {
		t.Fatalf("remove-peer %s: %+v %v", c.Nodes[victim].Name, out, err)
	}
	testutil.WaitFor(t, 5*time.Second, "the removal to reach every node", func() bool {
		for _, i := range c.Running() {
			if len(c.servers(i)) != 2 {
				return false
			}
		}
		return true
	})
	if got := voters(c.servers(l)); slices.Contains(got, c.Nodes[victim].Name) {
		t.Fatalf("voters after remove-peer: %v", got)
	}
	m, err := c.Operator(via).ClusterMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mem := range m.Members {
		if mem.ID == c.Nodes[victim].Name && mem.Suffrage != "none" {
			t.Fatalf("removed server listed as %+v", mem)
		}
	}
	if _, err := c.Operator(via).RemovePeer(ctx, "no-such-node"); !errors.Is(err, errcode.NotFound) {
		t.Fatalf("remove-peer of an unknown id: %v", err)
	}
	// Two voters still make a quorum.
	commit(t, acquire(t, c.Client(via), "after-remove", 30), `{"ok":true}`)
}

// remove-peer of a server that is still running says so: it answers
// no_leader until it is restarted.
func TestRemovePeerOfARunningServerSaysItRuns(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	victim := others(c, l)[0]
	out, err := c.Operator(l).RemovePeer(ctx, c.Nodes[victim].Name)
	if err != nil || !out.Removed || !out.Running {
		t.Fatalf("remove-peer of the running %s: %+v %v", c.Nodes[victim].Name, out, err)
	}
	// Once it has stopped hearing from the leader.
	n := 0
	testutil.WaitFor(t, 20*time.Second, "the removed server to answer no_leader", func() bool {
		n++
		_, err := c.Client(victim).Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("after-removal-%d", n), Owner: "o",
			TTLSeconds: 30, BlockSecs: wire.BlockNoWait})
		return errors.Is(err, errcode.NoLeader)
	})
}

// A leaving node hands over leadership, leaves the voter set and shuts
// down; the cluster shrinks to its last voter, which refuses to leave.
func TestLeaveShrinksTheVoterSet(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	names := []string{c.Nodes[0].Name, c.Nodes[1].Name, c.Nodes[2].Name}

	leaving := c.Nodes[l].Server
	out, err := c.Operator(l).ClusterLeave(ctx)
	if err != nil || !out.Left || out.NodeID != names[l] {
		t.Fatalf("leave of the leader: %+v %v", out, err)
	}
	waitDone(t, leaving, names[l])
	c.Stop(l)
	next := c.WaitLeader(10 * time.Second)
	rest := others(c)
	testutil.WaitFor(t, 10*time.Second, "the departed server to be gone from gossip and the configuration", func() bool {
		for _, m := range c.Nodes[next].Server.Node().Members() {
			if m.ID == names[l] && m.Status != "left" {
				return false
			}
		}
		return len(c.servers(next)) == 2
	})
	if got, want := voters(c.servers(next)), []string{names[rest[0]], names[rest[1]]}; !slices.Equal(got, want) {
		t.Fatalf("voters after the leader left: %v, want %v", got, want)
	}
	for _, i := range rest {
		commit(t, acquire(t, c.RetryingClient(i), "after-leave-"+names[i], 30), `{"ok":true}`)
	}

	// A follower leaves too: one voter remains, and it cannot leave.
	f := others(c, next)[0]
	leaving = c.Nodes[f].Server
	if _, err := c.Operator(f).ClusterLeave(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, leaving, names[f])
	c.Stop(f)
	if got := voters(c.servers(next)); !slices.Equal(got, []string{names[next]}) {
		t.Fatalf("voters: %v", got)
	}
	c.WaitLeader(10 * time.Second)
	if _, err := c.Operator(next).ClusterLeave(ctx); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("the last voter's leave: %v, want last_voter", err)
	}
	commit(t, acquire(t, c.RetryingClient(next), "alone", 30), `{"alone":true}`)

	// Leaving is not forever: started again with its data, a server that
	// left rejoins as any restarted server does.
	c.Start(l)
	testutil.WaitFor(t, 30*time.Second, "the restarted server to be a voter again", func() bool {
		return slices.Contains(voters(c.servers(next)), names[l])
	})
	c.WaitConverged(20 * time.Second)
}

// A follower cut off from the leader answers stale reads from its own
// state, and catches up once the partition heals.
func TestStaleReadOnAFollower(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	f := others(c, l)[0]
	commit(t, acquire(t, c.Client(l), "k", 30), `{"v":1}`)
	testutil.WaitFor(t, 5*time.Second, "the follower to apply the write", func() bool {
		d, err := c.Client(f).GetPublicStale(ctx, "", "k")
		return err == nil && string(d.Body) == `{"v":1}`
	})

	c.Partition([]int{f}, others(c, f))
	commit(t, acquire(t, c.RetryingClient(l), "k", 30), `{"v":2}`)
	d, err := c.Client(f).GetPublicStale(ctx, "", "k")
	if err != nil || string(d.Body) != `{"v":1}` || d.Version != 1 {
		t.Fatalf("stale read on the cut-off follower: %+v %v", d, err)
	}
	desc, err := c.Client(f).DescribeStale(ctx, "", "k")
	if err != nil || desc.Version != 1 {
		t.Fatalf("stale describe on the cut-off follower: %+v %v", desc, err)
	}
	// A linearizable read there cannot be answered.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if d, err := c.Client(f).GetPublic(lctx, "", "k"); err == nil {
		t.Fatalf("linearizable read on the cut-off follower answered %s", d.Body)
	}

	c.Heal()
	testutil.WaitFor(t, 10*time.Second, "the follower to catch up", func() bool {
		d, err := c.Client(f).GetPublicStale(ctx, "", "k")
		return err == nil && string(d.Body) == `{"v":2}`
	})
}

// lockd's TC endpoints: every node names the same leader, lists the live
// members' endpoints, confirms a member's announce and makes a member
// leave on request.
func TestTCLeaderListAnnounceLeave(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	urls := []string{c.URL(0), c.URL(1), c.URL(2)}
	slices.Sort(urls)
	for i := range c.Nodes {
		lead, err := c.Operator(i).TCLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if lead.LeaderID != c.Nodes[l].Name || lead.LeaderEndpoint != c.URL(l) || lead.Term == 0 ||
			lead.ExpiresAt < time.Now().Unix() || lead.ExpiresAt > time.Now().Add(5*time.Second).Unix() {
			t.Fatalf("tc leader from %s: %+v", c.Nodes[i].Name, lead)
		}
		list, err := c.Operator(i).TCList(ctx)
		if err != nil || !slices.Equal(list.Endpoints, urls) || list.UpdatedAt == 0 {
			t.Fatalf("tc list from %s: %+v %v, want %v", c.Nodes[i].Name, list, err, urls)
		}
	}
	f, g := others(c, l)[0], others(c, l)[1]
	ann, err := c.Operator(l).TCAnnounce(ctx, c.URL(f))
	if err != nil || !slices.Equal(ann.Endpoints, urls) {
		t.Fatalf("announce: %+v %v", ann, err)
	}
	if ttl := time.Until(time.Unix(ann.ExpiresAt, 0)); ttl < 25*time.Second || ttl > 32*time.Second {
		t.Fatalf("membership expires in %s, want the dead-server timeout (30s)", ttl)
	}
	if _, err := c.Operator(l).TCAnnounce(ctx, "http://127.0.0.1:1"); !errors.Is(err, errcode.NotFound) {
		t.Fatalf("announce of a stranger: %v", err)
	}
	if _, err := c.Operator(l).TCAnnounce(ctx, "not a url"); !errors.Is(err, errcode.InvalidEndpoint) {
		t.Fatalf("announce of a malformed endpoint: %v", err)
	}

	// Node f is asked (through g) to leave: it does, and shuts down.
	leaving := c.Nodes[f].Server
	left, err := c.Operator(g).TCLeave(ctx, c.URL(f))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(left.Endpoints, c.URL(f)) {
		t.Fatalf("endpoints after %s left: %v", c.Nodes[f].Name, left.Endpoints)
	}
	waitDone(t, leaving, c.Nodes[f].Name)
	c.Stop(f)
	want := []string{c.URL(l), c.URL(g)}
	slices.Sort(want)
	testutil.WaitFor(t, 10*time.Second, "the list to lose the departed node", func() bool {
		list, err := c.Operator(l).TCList(ctx)
		return err == nil && slices.Equal(list.Endpoints, want)
	})
	if got := voters(c.servers(l)); len(got) != 2 || slices.Contains(got, c.Nodes[f].Name) {
		t.Fatalf("voters after tc leave: %v", got)
	}
}

// A restore sent to a follower is redirected to the leader, and every node
// ends with the backup's state; fencing tokens keep growing.
func TestRestoreReachesEveryNode(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	f := others(c, l)[0]
	commit(t, acquire(t, c.Client(l), "a", 30), `{"a":"backup"}`)

	var backup bytes.Buffer
	if _, err := c.Operator(f).SaveSnapshot(ctx, &backup, nil); err != nil {
		t.Fatal(err)
	}
	commit(t, acquire(t, c.Client(l), "a", 30), `{"a":"later"}`)
	last := acquire(t, c.Client(l), "b", 30)
	commit(t, last, `{"b":"later"}`)

	res, err := c.Operator(f).RestoreSnapshot(ctx, bytes.NewReader(backup.Bytes()), int64(backup.Len()), nil)
	if err != nil || !res.Restored {
		t.Fatalf("restore through a follower: %+v %v", res, err)
	}
	c.WaitConverged(10 * time.Second)
	for _, i := range c.Running() {
		if d, err := c.Client(i).GetPublicStale(ctx, "", "a"); err != nil || string(d.Body) != `{"a":"backup"}` {
			t.Fatalf("a on %s: %+v %v", c.Nodes[i].Name, d, err)
		}
		if d, err := c.Client(i).GetPublicStale(ctx, "", "b"); err != nil || d.Exists {
			t.Fatalf("b on %s: %+v %v", c.Nodes[i].Name, d, err)
		}
	}
	if next := acquire(t, c.Client(f), "b", 30); next.FencingToken <= last.FencingToken {
		t.Fatalf("b's token after restore %d, before %d", next.FencingToken, last.FencingToken)
	}
	// Followers restarted after the restore come back with the same state.
	c.Stop(f)
	c.Start(f)
	c.WaitConverged(20 * time.Second)
}

// A server removed with remove-peer while it runs never hears of a leader
// again; `cluster leave` on it still ends, at the leader the other
// members know, and the server shuts down.
func TestALeaveOfAServerRemovedWhileItRunsEnds(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	victim := others(c, l)[0]
	name := c.Nodes[victim].Name
	if _, err := c.Operator(l).RemovePeer(ctx, name); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the removed server to lose its leader", func() bool {
		return !c.Nodes[victim].Server.Node().HasLeader()
	})
	leaving := c.Nodes[victim].Server
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := c.Operator(victim).ClusterLeave(ctx); err != nil || !out.Left {
		t.Fatalf("leave of a removed server: %+v %v", out, err)
	}
	waitDone(t, leaving, name)
	c.Stop(victim)
	if got := len(c.servers(l)); got != 2 {
		t.Fatalf("%d servers in the configuration, want 2", got)
	}
}

// A coordinator request that reaches a follower while no leader is known
// waits for the election to end, as every other request does, instead of
// answering no_leader at once.
func TestACoordinatorRequestWaitsForAnElection(t *testing.T) {
	c := Start(t, 3)
	l := c.WaitLeader(10 * time.Second)
	rest := others(c, l)
	f, g := rest[0], rest[1]
	// With the leader and another server frozen, f cannot elect anyone.
	c.Freeze(l)
	c.Freeze(g)
	t.Cleanup(func() { c.Thaw(l); c.Thaw(g) })
	testutil.WaitFor(t, 10*time.Second, "the follower to lose its leader", func() bool {
		return !c.Nodes[f].Server.Node().HasLeader()
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.Operator(f).TxnDecide(context.Background(), wire.TxnDecisionRequest{TxnID: xid.New().String(),
			State: wire.TxnStateRollback})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the request is in, waiting
	c.Thaw(g)
	if err := <-done; err != nil {
		t.Fatalf("a decide sent during an election: %v", err)
	}
}

// A server stopped while its peers do not answer (paused, or cut off by a
// network that drops their packets) stops within about a second: Raft's
// requests to them, and its dials still waiting for their answer, end with
// the server instead of running out their ten-second timeouts first.
func TestAServerWhosePeersDoNotAnswerStopsPromptly(t *testing.T) {
	c := Start(t, 3)
	l := c.WaitLeader(10 * time.Second)
	for _, i := range others(c, l) {
		c.Freeze(i)
	}
	// The leader's heartbeats and the candidate's votes now wait on
	// connections that get no answer.
	testutil.WaitFor(t, 10*time.Second, "the leader to step down", func() bool {
		return !c.Nodes[l].Server.Node().IsLeader()
	})
	start := time.Now()
	c.Stop(l)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("stopping a server whose peers do not answer took %s", took.Round(time.Millisecond))
	}
}
