package tc_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// A message another transaction holds on another island is a conflict the
// island finds without a Raft round, like a key: the transaction is rolled
// back there too, with what it holds there, and its lease there cannot
// commit it afterwards.
func TestAMessageHeldOnAnotherIslandConflictsAndRollsBackWhatTheTransactionHoldsThere(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	enqueue(t, b.client(), "in", "", "job")
	busy := dequeue(t, b.client(), "in", xid.New().String()) // owner "w", another txn
	txn := xid.New().String()
	la, lb := acquire(t, a.client(), "ka", txn, "me"), acquire(t, b.client(), "kb", txn, "me")
	stage(t, la, `{"v":1}`)
	stage(t, lb, `{"v":1}`)
	before := b.applied()
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit, Owner: "me",
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b), msgPart("in", busy.Message.MessageID, b)}})
	wantCode(t, err, http.StatusConflict, "txn_lock_conflict")
	if r := a.record(txn); r == nil || r.State != fsm.TxnRollback {
		t.Fatalf("a's record: %+v", r)
	}
	if r := b.record(txn); r == nil || r.State != fsm.TxnRollback {
		t.Errorf("b's record of the transaction after the conflict: %+v (applied %d -> %d)", r, before, b.applied())
	}
	if err := lb.Release(ctx, false); err == nil {
		t.Errorf("a release on b committed a transaction its coordinator rolled back")
	}
	if got := publicDoc(t, b.client(), "kb"); got != "" {
		t.Errorf("kb on b: %q (committed although the transaction rolled back)", got)
	}
}

// A commit naming a message another transaction holds on the home island
// is a lock conflict, as for a key.
func TestACommitNamingAMessageAnotherTransactionHoldsConflicts(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	enqueue(t, a.client(), "in", "", "job")
	busy := dequeue(t, a.client(), "in", xid.New().String()) // owner "w"
	txn := xid.New().String()
	stage(t, acquire(t, a.client(), "mine", txn, "bob"), `{"v":1}`)
	out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit, Owner: "bob",
		Participants: []wire.TxnParticipant{part("mine", a), msgPart("in", busy.Message.MessageID, a)}})
	if err == nil {
		t.Fatalf("commit naming a message delivered to another transaction succeeded: %+v (record %+v)", out, a.record(txn))
	}
	wantCode(t, err, http.StatusConflict, "txn_lock_conflict")
}

// A commit that names participants an island's earlier prepare did not has
// that island prepare them: a key held there by another is a conflict.
func TestACommitPreparesNewParticipantsOfAnIslandThatPrepared(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	other := acquire(t, b.client(), "kb2", xid.New().String(), "alice")
	txn := xid.New().String()
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("kb1", b)}}); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("kb1", b), part("kb2", b)}})
	if err == nil {
		t.Fatalf("commit naming kb2, held by alice on b, succeeded: %+v; b's record %+v", out, b.record(txn))
	}
	wantCode(t, err, http.StatusConflict, "txn_lock_conflict")
	_ = other
}

// A prepare may re-enter keys its owner holds; the commit (here by a
// release, which names no owner) does not find them a conflict again.
func TestACommitAfterAReentrantPrepareDoesNotConflict(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	acquire(t, a.client(), "ka", xid.New().String(), "w") // w's other transaction
	txn := xid.New().String()
	lb := acquire(t, b.client(), "kb", txn, "w")
	stage(t, lb, `{"v":1}`)
	ps := []wire.TxnParticipant{part("ka", a), part("kb", b)}
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending, Owner: "w",
		Participants: ps}); err != nil {
		t.Fatalf("re-entrant prepare: %v", err)
	}
	// The transaction commits through a release of its lease on b.
	if err := lb.Release(ctx, false); err != nil {
		t.Errorf("release (commit) of the prepared transaction: %v; a's record %+v", err, a.record(txn))
	}
	if r := a.record(txn); r == nil || r.State != fsm.TxnCommit {
		t.Fatalf("a's record: %+v", r)
	}
}
