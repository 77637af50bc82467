package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A voter's data directory is put back from an older copy, and its vote
// elects a leader without a write it had acknowledged: the write is lost
// to the cluster. The server that applied it, once back, must not keep
// serving it beside the others' state: when the leader's log replaces the
// entries it applied, it stops, and on restart drops its state and
// catches up from the cluster.
func TestAServerWhoseAppliedEntriesTheClusterReplacedResyncs(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	nodes := startStaticAt(t, "boot-a", dirs, []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"})
	closeNode := func(n *Node) {
		t.Helper()
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	leader := leaderOf(t, nodes)
	l := index(t, nodes, leader)
	f1, f2 := index(t, nodes, followers(nodes, leader)[0]), index(t, nodes, followers(nodes, leader)[1])
	acquireWhileLeadersChange(t, nodes, "before")

	// An older copy of f2's data directory.
	backup := filepath.Join(t.TempDir(), "copy")
	closeNode(nodes[f2])
	if err := os.CopyFS(backup, os.DirFS(dirs[f2])); err != nil {
		t.Fatal(err)
	}
	second := reopen(t, dirs[f2], nodes[f2], nil)
	waitApplied(t, second, leader.fsm.Applied())

	// The write lands on the leader and f2 only.
	closeNode(nodes[f1])
	acquire(t, leader, "acknowledged")
	waitApplied(t, second, leader.fsm.Applied())
	// The leader's snapshot holds it too.
	if err := leader.Snapshot(); err != nil {
		t.Fatal(err)
	}

	// Both go down; f2 comes back from the copy and, with f1, elects a
	// leader without the write.
	closeNode(leader)
	closeNode(second)
	if err := os.RemoveAll(dirs[f2]); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dirs[f2], os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	rest := []*Node{reopen(t, dirs[f1], nodes[f1], nil), reopen(t, dirs[f2], nodes[f2], nil)}
	acquireWhileLeadersChange(t, rest, "after")
	if hasKey(t, rest[0], "acknowledged") {
		t.Fatal("the scenario did not lose the write")
	}

	// The server that applied it comes back: the leader's log replaces
	// the entries it applied, and it stops.
	halted := make(chan error, 1)
	back := reopen(t, dirs[l], nodes[l], func(err error) {
		select {
		case halted <- err:
		default:
		}
	})
	select {
	case err := <-halted:
		if !strings.Contains(err.Error(), "drops entries") {
			t.Fatalf("stopped for %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a server whose applied entries the cluster replaced kept running")
	}
	closeNode(back)

	// Restarted, it drops its state and catches up with the cluster.
	again := reopen(t, dirs[l], nodes[l], nil)
	all := append(rest, again)
	acquireWhileLeadersChange(t, all, "last")
	waitApplied(t, again, leaderOf(t, all).fsm.Applied())
	if hasKey(t, again, "acknowledged") || !hasKey(t, again, "after") || !hasKey(t, again, "last") {
		t.Fatal("the restarted server's state is not the cluster's")
	}
	waitFor(t, 15*time.Second, "the resynced server to vote again", func() bool { return !again.Joining() })
}

func index(t *testing.T, nodes []*Node, n *Node) int {
	t.Helper()
	for i := range nodes {
		if nodes[i] == n {
			return i
		}
	}
	t.Fatalf("no node %s", n.ID())
	return -1
}
