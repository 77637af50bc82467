package testcluster

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
	"github.com/rs/xid"
)

// offClock is a wall clock set off by an offset a test can change.
type offClock struct{ off atomic.Int64 }

func (c *offClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// waitCorrected waits until node i corrects its clock, set off by off, to
// the members' median.
func waitCorrected(t *testing.T, c *Cluster, i int, off time.Duration) {
	t.Helper()
	waitFor(t, 15*time.Second, c.Nodes[i].Name+" to correct its clock to the members'", func() bool {
		mfs, err := c.Nodes[i].Server.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "raftlockd_clock_offset_seconds" {
				return math.Abs(mf.GetMetric()[0].GetGauge().GetValue()+off.Seconds()) < 0.25
			}
		}
		return false
	})
}

// The API counts time as the island judges expiries, whichever server
// answers: a prepare's expires_at_unix 20 s ahead is not refused as
// passed by a server whose own clock is 30 s ahead (corrected by its
// peers), nor is one further ahead than --max-ttl allows accepted by a
// server whose clock is two hours behind; the age of a queue's head is
// not told by either's own clock.
func TestTheAPICountsTimeByTheMembersClock(t *testing.T) {
	ahead, behind := &offClock{}, &offClock{}
	ahead.off.Store(int64(30 * time.Second))
	behind.off.Store(int64(-2 * time.Hour))
	c := Start(t, 5, WithClock("n4", ahead), WithClock("n5", behind))
	waitCorrected(t, c, 3, 30*time.Second)
	waitCorrected(t, c, 4, -2*time.Hour)
	ctx := context.Background()
	prepare := func(i int, expires time.Time) error {
		txn := xid.New().String()
		_, err := c.Operator(i).TxnPrepare(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
			Participants: []wire.TxnParticipant{{Key: "k-" + txn}}, ExpiresAtUnix: expires.Unix(),
			TCBackendHash: "other", TCTerm: 1})
		return err
	}
	if err := prepare(3, time.Now().Add(20*time.Second)); err != nil {
		t.Fatalf("a prepare expiring in 20 s, on the server whose clock is 30 s ahead: %v", err)
	}
	// --max-ttl is an hour; another island's clock may be a minute ahead.
	err := prepare(4, time.Now().Add(90*time.Minute))
	if !errors.Is(err, errcode.InvalidTTL) {
		t.Fatalf("a prepare expiring in 90 minutes, on the server whose clock is 2 h behind: %v, want invalid_ttl", err)
	}
	if _, err := c.Client(0).Enqueue(ctx, wire.EnqueueRequest{Queue: "q"}, []byte("m")); err != nil {
		t.Fatal(err)
	}
	enqueued := time.Now()
	for _, i := range []int{3, 4} {
		st, err := c.Client(i).QueueStats(ctx, "", "q", false)
		if err != nil {
			t.Fatal(err)
		}
		if age := time.Duration(st.HeadAgeSeconds) * time.Second; age > time.Since(enqueued)+time.Second {
			t.Fatalf("%s tells the head's age as %v; it was enqueued %v ago", c.Nodes[i].Name, age, time.Since(enqueued))
		}
	}
}
