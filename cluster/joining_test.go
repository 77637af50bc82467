package cluster

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
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

// When a majority lost their data at once, nothing is elected from what
// is left; the documented way on copies the survivor's Raft directory and
// state file into the emptied data directories, and the cluster leads
// again with every acknowledged write. The emptied servers had been
// started (that is how the operator found out): the copy lands on their
// own Raft directories, over what they held while joining.
func TestAClusterThatLostAMajorityGoesOnFromTheSurvivorsCopy(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStaticAt(t, "boot-a", dirs, []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"})
	acquireWhileLeadersChange(t, nodes, "kept")
	leader := leaderOf(t, nodes)
	for _, n := range nodes {
		waitApplied(t, n, leader.fsm.Applied())
	}
	lose := func(nodes []*Node) {
		t.Helper()
		for _, n := range nodes {
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
		}
		for _, i := range []int{1, 2} {
			for _, name := range []string{"raft", "state.db"} {
				if err := os.RemoveAll(filepath.Join(dirs[i], name)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	lose(nodes)
	// Emptied, they would only join; the survivor alone is no majority.
	var back []*Node
	for i, n := range nodes {
		back = append(back, reopen(t, dirs[i], n, nil))
	}
	waitFor(t, 15*time.Second, "the survivor to campaign", func() bool { return back[0].raft.State() == raft.Candidate })
	if currentLeader(back) != nil {
		t.Fatal("a leader was elected without a majority holding the data")
	}
	for _, n := range back {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{1, 2} {
		copyOver(t, filepath.Join(dirs[i], "raft"), filepath.Join(dirs[0], "raft"))
		copyOver(t, filepath.Join(dirs[i], "state.db"), filepath.Join(dirs[0], "state.db"))
	}
	var again []*Node
	for i, n := range nodes {
		again = append(again, reopen(t, dirs[i], n, nil))
	}
	acquireWhileLeadersChange(t, again, "after")
	for _, n := range again {
		waitApplied(t, n, leaderOf(t, again).fsm.Applied())
		if !hasKey(t, n, "kept") || n.Joining() {
			t.Fatalf("%s after the copy: kept=%v joining=%v", n.ID(), hasKey(t, n, "kept"), n.Joining())
		}
	}
}

// copyOver copies the file or directory tree src onto dst as `cp -r
// src/. dst` does: files of src replace those of dst, and dst's other
// files stay.
func copyOver(t *testing.T, dst, src string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, raw, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A server restarted part way through joining holds Raft state of its
// own log store by then; it is still joining, with the mark it wrote or
// with the empty mark of an earlier build.
func TestAServerRestartedWhileJoiningIsStillJoining(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		dir := t.TempDir()
		cfg := testConfig(dir, "boot-a")
		cfg.Bootstrap = false
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !n.Joining() {
			t.Fatal("a server started without Raft state is not joining")
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		// What a leader's first request leaves in the store: a term.
		store, err := raftboltdb.NewBoltStore(raftLogIn(raftDirOf(dir)))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.SetUint64([]byte("CurrentTerm"), 2); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		if legacy {
			if err := os.WriteFile(joiningIn(raftDirOf(dir)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		again, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if again.raft.CurrentTerm() != 2 {
			t.Fatalf("legacy=%v: the store lost its term", legacy)
		}
		if !again.Joining() {
			t.Fatalf("legacy=%v: a server restarted part way through joining votes", legacy)
		}
		if err := again.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
