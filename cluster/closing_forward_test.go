package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
)

// Commands forwarded to a leader that closes without handing its
// leadership over (as after a failed hand-over) are not answered
// shutdown_draining, which tells a client that the command may have been
// applied, nor not_leader: the leader refuses what arrives while it
// closes before proposing anything, and the follower takes those to the
// next leader. (A forwarded command whose answer the closing leader's
// connection cut is of an unknown outcome, and may fail as such.)
// Linearizable reads through the followers ask the next leader too.
func TestCallsThroughFollowersWhileTheLeaderClosesReachTheNextLeader(t *testing.T) {
	for what, op := range map[string]func(ctx context.Context, n *Node, w, i int) error{
		"commands": nil,
		"reads": func(ctx context.Context, n *Node, _, _ int) error {
			return n.Read(ctx, func(*fsm.View) error { return nil })
		},
	} {
		t.Run(what, func(t *testing.T) {
			nodes := startStatic(t, 3)
			old := leaderOf(t, nodes)
			var p *calls
			if op == nil {
				p = proposeThrough(followers(nodes, old), 8)
			} else {
				p = callThrough(followers(nodes, old), 8, op)
			}
			waitFor(t, 10*time.Second, what+" through the followers", p.appliedAtLeast(100))
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, what+" under the next leader", p.appliedAtLeast(p.count()+100))
			done, failed := p.end()
			for why := range failed {
				if strings.HasPrefix(why, "shutdown_draining:") || strings.HasPrefix(why, "not_leader:") {
					t.Fatalf("%s through the followers failed: %v (%d done)", what, failed, done)
				}
			}
			t.Logf("%d %s done; failed: %v", done, what, failed)
		})
	}
}

// A linearizable read through a follower is not answered not_leader while
// the server raft made leader has not yet heard that it leads (it answers
// not_leader until then): the follower asks it again once it has.
func TestAReadThroughAFollowerWaitsForTheLeaderToKnowItLeads(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderOf(t, nodes)
	f := followers(nodes, leader)[0]
	leader.leader.Store(false)
	knows := time.AfterFunc(300*time.Millisecond, func() { leader.leader.Store(true) })
	defer knows.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Read(ctx, func(*fsm.View) error { return nil }); err != nil {
		t.Fatalf("a read through a follower while the leader did not know it led yet: %v", err)
	}
}
