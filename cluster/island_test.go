package cluster

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A server started on another island's data directory, with the same id
// and Raft address as one of this island's servers (a staging cluster's
// directory restored onto a production host), holds a longer log of
// higher terms. Raft between them would elect it and overwrite this
// island's committed entries; the islands refuse each other's Raft
// connections instead, and this island keeps serving what it committed.
func TestAServerOfAnotherIslandCannotTakeOver(t *testing.T) {
	dirsB := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	b := startStaticAt(t, "boot-b", dirsB, []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"})
	addrs := make([]string, len(b))
	for i, n := range b {
		addrs[i] = n.RaftAddr()
	}
	// Island B goes through a few terms, so that its log ends in a term
	// island A has not reached.
	for i := 0; i < 3; i++ {
		acquireWhileLeadersChange(t, b, "b-only-"+strconv.Itoa(i))
		if err := leaderOf(t, b).raft.LeadershipTransfer().Error(); err != nil {
			t.Fatal(err)
		}
	}
	acquireWhileLeadersChange(t, b, "b-only-last")
	last := leaderOf(t, b)
	termB := last.raft.CurrentTerm()
	for _, n := range b {
		waitApplied(t, n, last.fsm.Applied())
	}
	for _, n := range b {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}

	a := startStaticAt(t, "boot-a", []string{t.TempDir(), t.TempDir(), t.TempDir()}, addrs)
	acquire(t, leaderOf(t, a), "a-1")
	for _, n := range a {
		waitFor(t, 15*time.Second, "every server of A to know its island", func() bool { return n.BackendHash() != "" })
	}
	if a[0].BackendHash() == b[0].BackendHash() {
		t.Fatal("two islands drew the same backend hash")
	}
	var stay []*Node
	for _, n := range a {
		if n.ID() != "n3" {
			stay = append(stay, n)
			continue
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if a[0].raft.CurrentTerm() >= termB {
		t.Fatalf("island B's log should end in a later term (%d) than island A's (%d)", termB, a[0].raft.CurrentTerm())
	}

	intruder := reopen(t, dirsB[2], a[2], nil)
	// It campaigns (and answers the leader's heartbeats with its later
	// term) until it gives up or is stopped.
	waitFor(t, 15*time.Second, "the intruder to be refused three times by each server", func() bool {
		return intruder.IsLeader() || stay[0].mux.refusals.Load() >= 3 && stay[1].mux.refusals.Load() >= 3
	})

	if intruder.IsLeader() {
		t.Fatal("a server of another island was elected")
	}
	// The operator sees it in the island's member list.
	members, err := stay[0].MemberStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if flagged := m.Err != nil && strings.Contains(m.Err.Error(), "another island"); flagged != (m.ID == "n3") {
			t.Fatalf("member %s: status %+v, error %v", m.ID, m.Status, m.Err)
		}
	}
	leader := leaderOf(t, stay)
	acquire(t, leader, "a-2")
	for _, n := range stay {
		for _, key := range []string{"a-1", "a-2"} {
			if !hasKey(t, n, key) {
				t.Fatalf("%s lost %s, committed in its island", n.ID(), key)
			}
		}
		if hasKey(t, n, "b-only-last") {
			t.Fatalf("%s holds an entry of another island", n.ID())
		}
	}
}

// acquireWhileLeadersChange acquires key through the leader, asking again
// while leadership moves.
func acquireWhileLeadersChange(t *testing.T, nodes []*Node, key string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := leaderOf(t, nodes).Propose(context.Background(), acquireCmd(key))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire %s: %v", key, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitApplied(t *testing.T, n *Node, index uint64) {
	t.Helper()
	waitFor(t, 15*time.Second, n.ID()+" to apply "+strconv.FormatUint(index, 10), func() bool { return n.fsm.Applied() >= index })
}
