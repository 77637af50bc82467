package rm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// racingStore applies another command just before the next command of op,
// as a request served at the same moment may be.
type racingStore struct {
	*fsmStore
	op     fsm.Op
	before *fsm.Command
}

func (s *racingStore) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	if cmd.Op == s.op && s.before != nil {
		other := s.before
		s.before = nil
		if _, err := s.fsmStore.Propose(ctx, other); err != nil {
			return nil, err
		}
	}
	return s.fsmStore.Propose(ctx, cmd)
}

// A prepare whose conflict is found only when it is applied (another owner
// took a participant since the prepare looked) answers the conflict as one
// found before does: having rolled back what the transaction held here, so
// that nothing it staged here can commit after its coordinator rolled it
// back for the conflict.
func TestAConflictFoundWhenThePrepareIsAppliedRollsBackWhatTheTransactionHeld(t *testing.T) {
	base := newFSMStore(t)
	txn := xid.New().String()
	ctx := context.Background()
	if _, err := base.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: "k1",
		Owner: "w", TxnID: txn, LeaseID: xid.New().String(), RequestID: xid.New().String(), TTL: 60_000}}); err != nil {
		t.Fatal(err)
	}
	s := &racingStore{fsmStore: base, op: fsm.OpTxnPrepare, before: &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: "k2", Owner: "other", TxnID: xid.New().String(), LeaseID: xid.New().String(),
		RequestID: xid.New().String(), TTL: 60_000}}}
	e := NewEnlisted(s, s, storeClock{base}, 30*time.Second)
	_, err := e.Prepare(ctx, Coordinated{TxnID: txn, Home: "island-h", Term: 1, Owner: "w",
		ExpiresAt:    time.UnixMilli(base.now).Add(time.Minute),
		Participants: []fsm.Participant{{Namespace: "default", Key: "k1"}, {Namespace: "default", Key: "k2"}}})
	if ee := (*errcode.Error)(nil); !errors.As(err, &ee) || ee.Code != errcode.TxnLockConflict.Code {
		t.Fatalf("prepare: %v, want txn_lock_conflict", err)
	}
	var rec fsm.KeyRecord
	var tr *fsm.TxnRecord
	_ = base.f.View(func(v *fsm.View) error {
		rec, _ = v.Key("default", "k1")
		tr = v.Txn(txn)
		return nil
	})
	if rec.Lease != nil || tr == nil || tr.State != fsm.TxnRollback {
		t.Fatalf("the transaction still holds k1 after answering the conflict: lease %+v, record %+v", rec.Lease, tr)
	}
}

// A prepare whose expiry has passed by the time its entry is stamped is
// refused as invalid_ttl, as one whose expiry had passed when the request
// was read is, not with an internal error.
func TestAPrepareExpiredBeforeItIsRecordedIsInvalidTTL(t *testing.T) {
	s := newFSMStore(t)
	e := NewEnlisted(s, s, storeClock{s}, 30*time.Second)
	txn := xid.New().String()
	_, err := e.Prepare(context.Background(), Coordinated{TxnID: txn, Home: "island-h", Term: 1,
		ExpiresAt: time.UnixMilli(s.now), Participants: []fsm.Participant{{Namespace: "default", Key: "k"}}})
	if ee := (*errcode.Error)(nil); !errors.As(err, &ee) || ee.Code != errcode.InvalidTTL.Code {
		t.Fatalf("prepare: %v, want invalid_ttl", err)
	}
	var tr *fsm.TxnRecord
	_ = s.f.View(func(v *fsm.View) error { tr = v.Txn(txn); return nil })
	if tr != nil {
		t.Fatalf("the refused prepare recorded %+v", tr)
	}
}

// A request meant for another island gets txn_backend_mismatch naming this
// one, so that the caller tries that island's next endpoint; a server that
// does not know its island yet answers 503 unavailable, to be asked again,
// since it may be the island meant.
func TestNotTargetNamesTheIslandOnlyWhenItKnowsIt(t *testing.T) {
	if e := NotTarget("island-a", "island-b"); e.Code != errcode.TxnBackendMismatch.Code || e.Island != "island-a" {
		t.Fatalf("island-a asked as island-b: %+v", e)
	}
	if e := NotTarget("", "island-b"); e.Code != errcode.Unavailable.Code || e.RetryAfter == 0 {
		t.Fatalf("a server without its island's hash asked as island-b: %+v", e)
	}
}
