package tc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// countingRemote prepares (or, when conflict is set, refuses with a lock
// conflict) and applies every decision; it counts the calls.
type countingRemote struct {
	Remote
	mu       sync.Mutex
	prepares []wire.TxnDecisionRequest
	applies  []wire.TxnDecisionRequest
	conflict bool
}

func (r *countingRemote) Prepare(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prepares = append(r.prepares, req)
	if r.conflict {
		return wire.TxnDecisionResponse{}, errcode.TxnLockConflict.With("%salice", fsm.LockedPrefix)
	}
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: fsm.TxnPending}, nil
}

func (r *countingRemote) Apply(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applies = append(r.applies, req)
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: req.State}, nil
}

func countingCoordinator(t *testing.T) (*Coordinator, *countingRemote) {
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	remote := &countingRemote{}
	self := "a"
	if _, err := store.Propose(context.Background(), &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Hash: self}}); err != nil {
		t.Fatal(err)
	}
	c := New(store, fixedIsland{self, []string{"https://a1"}}, remote, store, Config{FanoutAttempts: 1})
	if _, err := c.Register(context.Background(), fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	return c, remote
}

// A commit naming what the prepare named prepares nothing again, whatever
// form the request gives the participants in.
func TestACommitAfterAPrepareDoesNotPrepareAgain(t *testing.T) {
	c, remote := countingCoordinator(t)
	ctx := context.Background()
	txn := "d4u1jq0n4ncs73cnv2f0"
	if _, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnPending, Participants: []fsm.Participant{
		{Namespace: "", Key: "ka"}, {Backend: "b", Namespace: "", Key: "kb"}}}); err != nil {
		t.Fatal(err)
	}
	if n := len(remote.prepares); n != 1 {
		t.Fatalf("%d prepares", n)
	}
	info, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnCommit, Participants: []fsm.Participant{
		{Namespace: "default", Key: "ka"}, {Backend: " b", Namespace: "default", Key: "kb"}}})
	if err != nil || info.State != fsm.TxnCommit {
		t.Fatalf("commit: %+v %v", info, err)
	}
	if n := len(remote.prepares); n != 1 {
		t.Fatalf("the commit prepared b again: %d prepares", n)
	}
}

// An island that prepared kb1 and refuses the commit's new kb2 with a
// conflict (found when its prepare is applied) still holds kb1: it is told
// the rollback, as prepareFailed promises for an island that had prepared.
func TestAnIslandPreparedAgainThatRefusesIsToldTheRollback(t *testing.T) {
	c, remote := countingCoordinator(t)
	ctx := context.Background()
	txn := "d4u1jq0n4ncs73cnv2fg"
	if _, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnPending, Participants: []fsm.Participant{
		{Backend: "b", Namespace: "default", Key: "kb1"}}}); err != nil {
		t.Fatal(err)
	}
	remote.conflict = true
	_, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnCommit, Participants: []fsm.Participant{
		{Backend: "b", Namespace: "default", Key: "kb1"}, {Backend: "b", Namespace: "default", Key: "kb2"}}})
	if e := envelope(err); e == nil || e.Code != errcode.TxnLockConflict.Code {
		t.Fatalf("commit: %v", err)
	}
	if len(remote.applies) == 0 {
		t.Fatalf("b, which had prepared kb1, was never told the rollback (prepares %d, applies 0)", len(remote.prepares))
	}
}

// refusingRemote prepares every participant and answers every decision
// with err.
type refusingRemote struct {
	countingRemote
	err error
}

func (r *refusingRemote) Apply(context.Context, string, wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return wire.TxnDecisionResponse{}, r.err
}

// A commit that the state machine records as a rollback (a lease of the
// transaction expired here) answers txn_rolled_back, as a repeat of it
// does, also while an island has not been told the rollback yet: it does
// not answer txn_fanout_failed, which says the decision asked for was
// recorded.
func TestACommitRecordedAsARollbackAnswersTheRollbackWhileAnIslandMissesIt(t *testing.T) {
	c, store := islandAWith(t, &refusingRemote{err: errcode.TxnUnreachable.With("island b does not answer")})
	ctx := context.Background()
	txn := "d4u1jq0n4ncs73cnv2h0"
	if _, err := store.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: "ka",
		Owner: "w", TxnID: txn, LeaseID: "d4u1jq0n4ncs73cnv2hg", RequestID: "r1", TTL: 5_000}}); err != nil {
		t.Fatal(err)
	}
	store.now = store.now.Add(10 * time.Second) // the lease expired; no sweep ran yet
	commit := Decision{TxnID: txn, State: fsm.TxnCommit, Participants: []fsm.Participant{
		{Namespace: "default", Key: "ka"}, {Backend: "b", Namespace: "default", Key: "kb"}}}
	for _, attempt := range []string{"commit", "repeated commit"} {
		_, err := c.Decide(ctx, commit)
		if e := envelope(err); e == nil || e.Code != errcode.TxnRolledBack.Code {
			t.Fatalf("%s: %v, want txn_rolled_back", attempt, err)
		}
	}
	if rec, _ := c.record(ctx, txn); rec == nil || rec.State != fsm.TxnRollback || rec.Reason != fsm.ReasonExpired {
		t.Fatalf("record: %+v", rec)
	}
}

// slowRemote prepares every participant, taking until after the moment
// the store's clock is moved to; it records the decisions it is sent.
type slowRemote struct {
	countingRemote
	store *applyStore
	after time.Time
}

func (r *slowRemote) Prepare(ctx context.Context, ep string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.store.mu.Lock()
	r.store.now = r.after
	r.store.mu.Unlock()
	return r.countingRemote.Prepare(ctx, ep, req)
}

// A pending decision whose expiry passes while the other islands prepare is
// presumed aborted: the prepare answers txn_rolled_back and the islands
// that prepared are told the rollback, rather than the prepare failing
// with an internal error because the state machine refuses to extend a
// pending decision past its expiry.
func TestAPendingDecisionThatExpiresWhileIslandsPrepareIsRolledBack(t *testing.T) {
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	ctx := context.Background()
	if _, err := store.Propose(ctx, &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Hash: "a"}}); err != nil {
		t.Fatal(err)
	}
	expiry := store.now.Add(2 * time.Second)
	remote := &slowRemote{store: store, after: expiry.Add(time.Millisecond)}
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store, Config{FanoutAttempts: 1})
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	txn := "d4u1jq0n4ncs73cnv2i0"
	_, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnPending, ExpiresAt: expiry, Participants: []fsm.Participant{
		{Namespace: "default", Key: "ka"}, {Backend: "b", Namespace: "default", Key: "kb"}}})
	if e := envelope(err); e == nil || e.Code != errcode.TxnRolledBack.Code {
		t.Fatalf("prepare: %v, want txn_rolled_back", err)
	}
	if rec, _ := c.record(ctx, txn); rec == nil || rec.State != fsm.TxnRollback || rec.Reason != fsm.ReasonPresumedAbort {
		t.Fatalf("record: %+v", rec)
	}
	if len(remote.applies) != 1 || remote.applies[0].State != fsm.TxnRollback {
		t.Fatalf("b, which prepared, was not told the rollback: %+v", remote.applies)
	}
}

// A pending decision whose expiry has passed when it would be recorded is
// refused as invalid_ttl, as an expiry in the past is at the endpoint, not
// with an internal error.
func TestAPendingDecisionExpiredBeforeItIsRecordedIsInvalidTTL(t *testing.T) {
	c, _ := countingCoordinator(t)
	now := c.clock.Now()
	_, err := c.Decide(context.Background(), Decision{TxnID: "d4u1jq0n4ncs73cnv2ig", State: fsm.TxnPending, ExpiresAt: now,
		Participants: []fsm.Participant{{Namespace: "default", Key: "ka"}}})
	if e := envelope(err); e == nil || e.Code != errcode.InvalidTTL.Code {
		t.Fatalf("prepare: %v, want invalid_ttl", err)
	}
	if rec, _ := c.record(context.Background(), "d4u1jq0n4ncs73cnv2ig"); rec != nil {
		t.Fatalf("record: %+v", rec)
	}
}

// A replay that rolls back an expired pending decision answers the
// rollback, as a repeat of it does, also when an island had committed the
// transaction itself: a replay tells the decision (an island in doubt
// asks it for it), not whether the outcome differs between islands.
func TestAReplayAnswersTheDecisionAnIslandRefused(t *testing.T) {
	// b answers as an island that had committed the transaction itself
	// (a local release).
	c, store := islandAWith(t, &refusingRemote{err: errcode.TxnCommitted.With("transaction already committed")})
	ctx := context.Background()
	txn := "d4u1jq0n4ncs73cnv2j0"
	if _, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnPending, ExpiresAt: store.now.Add(2 * time.Second),
		Participants: []fsm.Participant{{Namespace: "default", Key: "ka"}, {Backend: "b", Namespace: "default", Key: "kb"}}}); err != nil {
		t.Fatal(err)
	}
	store.now = store.now.Add(3 * time.Second)
	for _, attempt := range []string{"replay", "repeated replay"} {
		if info, err := c.Replay(ctx, txn); err != nil || info.State != fsm.TxnRollback {
			t.Fatalf("%s: %+v %v, want the rollback", attempt, info, err)
		}
	}
}

// islandAWith is the coordinator of island "a" over a store of its own,
// whose clock the test moves, reaching island b through remote.
func islandAWith(t *testing.T, remote Remote) (*Coordinator, *applyStore) {
	t.Helper()
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	ctx := context.Background()
	if _, err := store.Propose(ctx, &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Hash: "a"}}); err != nil {
		t.Fatal(err)
	}
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store, Config{FanoutAttempts: 1})
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	return c, store
}
