package cluster

import (
	"os"
	"testing"
	"time"
)

// A voter whose data directory was emptied comes back under its id and
// address. The write it acknowledged may now be held by one other server
// only; while that server is down, the third (which missed the write)
// must not be elected with the emptied server's vote, nor the emptied
// server itself. Once the server holding the write is back, the cluster
// leads again, keeps the write, and the emptied server votes again once
// it has caught up.
func TestAnEmptiedVoterVotesOnlyOnceItHasCaughtUp(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStaticAt(t, "boot-a", dirs, []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"})

	// The write lands on a majority that leaves one server out.
	leader := leaderOf(t, nodes)
	behind := followers(nodes, leader)[0]
	if err := behind.Close(); err != nil {
		t.Fatal(err)
	}
	keeper := leader
	emptied := followers(followers(nodes, leader), behind)[0]
	acquire(t, keeper, "acknowledged")
	waitApplied(t, emptied, keeper.fsm.Applied())

	// The other server of that majority loses its data directory and
	// comes back empty; the one holding the write goes down.
	if err := emptied.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dirs[index(t, nodes, emptied)]); err != nil {
		t.Fatal(err)
	}
	if err := keeper.Close(); err != nil {
		t.Fatal(err)
	}
	emptiedAgain := reopen(t, dirs[index(t, nodes, emptied)], emptied, nil)
	if !emptiedAgain.Joining() || !emptiedAgain.Status().Joining {
		t.Fatal("a server started without Raft state is not joining")
	}
	behindAgain := reopen(t, dirs[index(t, nodes, behind)], behind, nil)
	waitFor(t, 15*time.Second, "the server that missed the write to ask the emptied one for its vote, twice", func() bool {
		return emptiedAgain.transport.votesRefused.Load() >= 2 || behindAgain.IsLeader() || emptiedAgain.IsLeader()
	})
	if behindAgain.IsLeader() || emptiedAgain.IsLeader() {
		t.Fatal("a server was elected without the acknowledged write")
	}

	keeperAgain := reopen(t, dirs[index(t, nodes, keeper)], keeper, nil)
	back := []*Node{keeperAgain, behindAgain, emptiedAgain}
	acquireWhileLeadersChange(t, back, "after")
	leader = leaderOf(t, back)
	for _, n := range back {
		waitApplied(t, n, leader.fsm.Applied())
		if !hasKey(t, n, "acknowledged") {
			t.Fatalf("%s lost the acknowledged write", n.ID())
		}
	}
	waitFor(t, 15*time.Second, "the emptied server to catch up and vote again", func() bool { return !emptiedAgain.Joining() })
	if _, err := os.Stat(joiningIn(raftDirOf(dirs[index(t, nodes, emptied)]))); !os.IsNotExist(err) {
		t.Fatalf("the joining mark outlived the catch-up: %v", err)
	}
	// It now takes part in elections: with it, a majority elects a leader.
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	leaderOf(t, followers(back, leader))
}
