package rm

import (
	"context"
	"log/slog"
	"testing"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/fsm"
)

// grantingStore applies before, once, just before the first command of op:
// steps the leader took between the read of the state and that command.
type grantingStore struct {
	*fsmStore
	op     fsm.Op
	before []*fsm.Command
}

func (s *grantingStore) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	if cmd.Op == s.op && s.before != nil {
		others := s.before
		s.before = nil
		for _, other := range others {
			if _, err := s.fsmStore.Propose(ctx, other); err != nil {
				return nil, err
			}
		}
	}
	return s.fsmStore.Propose(ctx, cmd)
}

// withdrawOrphansOnce runs WithdrawOrphans for one installed state and
// returns once it has gone through that state's orphans.
func withdrawOrphansOnce(t *testing.T, store Store, self Server) {
	t.Helper()
	waits := NewWaits()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		WithdrawOrphans(ctx, store, waits, self, slog.New(slog.DiscardHandler))
	}()
	waits.Observe([]fsm.Event{{Kind: fsm.EventRestored}})
	// A second installed state is taken up only once the first is done.
	waits.restored <- struct{}{}
	waits.restored <- struct{}{}
	cancel()
	<-done
}

// An orphaned acquire granted the key between the read of the installed
// state and its withdrawal is answered with that lease: the lease is
// released rather than left to a client that is gone for its whole TTL.
func TestAnOrphanGrantedTheKeyBeforeItsWithdrawalReleasesIt(t *testing.T) {
	base := newFSMStore(t)
	ctx := context.Background()
	held := holdKey(t, base)
	if r, err := base.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: "k",
		Owner: "gone", TxnID: xid.New().String(), LeaseID: xid.New().String(), RequestID: xid.New().String(), Attempt: "a1", TTL: 60_000, Wait: 60_000, Node: "n1", Run: "old"}}); err != nil || !r.Queued {
		t.Fatalf("the acquire of the earlier run did not queue: %+v %v", r, err)
	}
	st := &grantingStore{fsmStore: base, op: fsm.OpCancelWait, before: []*fsm.Command{{Op: fsm.OpRelease,
		Release: &fsm.ReleaseCmd{Namespace: "default", Key: "k", LeaseID: held.Lease.LeaseID, TxnID: held.Lease.TxnID}}}}
	withdrawOrphansOnce(t, st, Server{ID: "n1", Run: "now"})
	var rec fsm.KeyRecord
	_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Lease != nil {
		t.Fatalf("the key stays leased to %s, whose request ended in an earlier run", rec.Lease.Owner)
	}
}

// An orphaned dequeue handed a message between the read of the installed
// state and its withdrawal hands the message back: it is ready again,
// rather than in flight to a consumer that is gone until its visibility
// runs out.
func TestAnOrphanHandedAMessageBeforeItsWithdrawalHandsItBack(t *testing.T) {
	base := newFSMStore(t)
	ctx := context.Background()
	if _, err := base.Propose(ctx, &fsm.Command{Op: fsm.OpDequeue, Dequeue: &fsm.DequeueCmd{Namespace: "default", Queue: "q",
		Owner: "gone", RequestID: "rg", LeaseID: "lg", Visibility: 3_600_000, Wait: 60_000, Node: "n1", Run: "old"}}); err != nil {
		t.Fatal(err)
	}
	st := &grantingStore{fsmStore: base, op: fsm.OpQCancel, before: []*fsm.Command{{Op: fsm.OpEnqueue,
		Enqueue: &fsm.EnqueueCmd{Namespace: "default", Queue: "q", ID: "m1", Visibility: 30_000, MaxAttempts: 5}}}}
	withdrawOrphansOnce(t, st, Server{ID: "n1", Run: "now"})
	var s fsm.QueueStats
	_ = base.f.View(func(v *fsm.View) error { s = v.QueueStats("default", "q"); return nil })
	if s.Ready != 1 || s.InFlight != 0 {
		t.Fatalf("the message handed to a consumer of an earlier run is not ready again: %+v", s)
	}
}

// A retry of the orphaned acquire (its idempotency key, sent to another
// server) that took its place over and was granted the key keeps the
// lease: the withdrawal of the orphan's attempt is answered with it, and
// nothing in it tells the retry's grant from the orphan's.
func TestAnOrphanLeavesTheLeaseOfARetryElsewhere(t *testing.T) {
	base := newFSMStore(t)
	ctx := context.Background()
	held := holdKey(t, base)
	orphan := fsm.AcquireCmd{Namespace: "default", Key: "k", Owner: "c", TxnID: xid.New().String(), LeaseID: xid.New().String(),
		RequestID: idemPrefix + "r", Attempt: "a1", TTL: 60_000, Wait: 60_000, Node: "n1", Run: "old"}
	if r, err := base.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &orphan}); err != nil || !r.Queued {
		t.Fatalf("the acquire of the earlier run did not queue: %+v %v", r, err)
	}
	retry := orphan
	retry.Attempt, retry.LeaseID, retry.TxnID, retry.Node, retry.Run = "a2", xid.New().String(), xid.New().String(), "n2", "n2run"
	st := &grantingStore{fsmStore: base, op: fsm.OpCancelWait, before: []*fsm.Command{
		{Op: fsm.OpAcquire, Acquire: &retry},
		{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{Namespace: "default", Key: "k", LeaseID: held.Lease.LeaseID, TxnID: held.Lease.TxnID}}}}
	withdrawOrphansOnce(t, st, Server{ID: "n1", Run: "now"})
	var rec fsm.KeyRecord
	_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Lease == nil || rec.Lease.RequestID != retry.RequestID {
		t.Fatalf("the lease granted to the retry was handed back: %+v", rec.Lease)
	}
}

// holdKey has owner "a" take key "k" for a minute in a transaction of its
// own.
func holdKey(t *testing.T, s Store) *fsm.Result {
	t.Helper()
	held, err := s.Propose(context.Background(), &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: "k",
		Owner: "a", TxnID: xid.New().String(), LeaseID: xid.New().String(), RequestID: xid.New().String(), TTL: 60_000}})
	if err != nil {
		t.Fatal(err)
	}
	return held
}
