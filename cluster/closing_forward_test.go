package cluster

import (
	"strings"
	"testing"
	"time"
)

// Commands forwarded to a leader that closes without handing its
// leadership over (as after a failed hand-over) are not answered
// shutdown_draining, which tells a client that the command may have been
// applied, nor not_leader: the leader refuses what arrives while it
// closes before proposing anything, and the follower takes those to the
// next leader. (A forwarded command whose answer the closing leader's
// connection cut is of an unknown outcome, and may fail as such.)
func TestCommandsForwardedToAClosingLeaderReachTheNextLeader(t *testing.T) {
	nodes := startStatic(t, 3)
	old := leaderOf(t, nodes)
	p := proposeThrough(followers(nodes, old), 8)
	waitFor(t, 10*time.Second, "commands through the followers", p.appliedAtLeast(100))
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "commands under the next leader", p.appliedAtLeast(p.count()+100))
	applied, failed := p.end()
	for why := range failed {
		if strings.HasPrefix(why, "shutdown_draining:") || strings.HasPrefix(why, "not_leader:") {
			t.Fatalf("commands forwarded to the closing leader failed: %v (%d applied)", failed, applied)
		}
	}
	t.Logf("%d commands applied; failed: %v", applied, failed)
}
