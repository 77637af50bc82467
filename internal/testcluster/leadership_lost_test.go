package testcluster

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// slowElections gives the leader time to take a write after it is cut off
// and before it steps down (its lease is half the heartbeat timeout).
func slowElections(s *config.Server) {
	s.HeartbeatTimeout, s.ElectionTimeout = time.Second, time.Second
}

// A write forwarded to a leader that loses its quorum is in the leader's
// log and in the forwarding follower's, and commits once that follower
// leads: the leader, stepping down, answers it as of an unknown outcome
// (503 unavailable), which a client does not resend unless the write is
// idempotent; not_leader (nothing was done) would have it resent, and
// enqueued twice.
func TestAWriteTheLeaderLostIsAnsweredAsUnknownAndAppliedOnce(t *testing.T) {
	c := Start(t, 5, Configure(slowElections))
	a := c.WaitLeader(10 * time.Second)
	rest := others(c, a)
	f, b, cc, d := rest[0], rest[1], rest[2], rest[3]
	producer := c.RetryingClient(f)

	// The leader keeps only f: it cannot commit, and steps down once its
	// lease ends. Only f, holding the write, can then win an election.
	c.Partition([]int{a}, []int{b, cc}, []int{d})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := producer.EnqueueWithKey(ctx, wire.EnqueueRequest{Queue: "lost"}, []byte("once"), "")
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.Envelope.Code != errcode.Unavailable.Code {
		t.Errorf("a write whose leader lost its quorum before committing it: %v, want 503 unavailable", err)
	}

	testutil.WaitFor(t, 20*time.Second, c.Nodes[f].Name+" to lead", func() bool { return c.Leader() == f })
	st, err := c.Client(f).QueueStats(ctx, "", "lost", false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 1 {
		t.Fatalf("the write answered as unknown is enqueued %d times, want once (the new leader holds it)", st.Ready)
	}
	c.Heal()
	c.WaitConverged(20 * time.Second)
}
