package rm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// lostAnswerStore applies the next command of op and then fails it, as a
// follower's forward does when the caller's context ends mid-flight.
type lostAnswerStore struct {
	*fsmStore
	lose     fsm.Op
	proposed map[fsm.Op]int
	noLeader bool // answer every command as a cluster without a leader does
}

func (s *lostAnswerStore) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	op := cmd.Op
	if s.proposed == nil {
		s.proposed = map[fsm.Op]int{}
	}
	s.proposed[op]++
	if s.noLeader {
		return nil, errcode.NoLeader.With("no leader elected within 1s")
	}
	res, err := s.fsmStore.Propose(ctx, cmd)
	if op == s.lose {
		s.lose = ""
		return nil, errors.New("forward to the leader: context canceled")
	}
	return res, err
}

type storeClock struct{ s *fsmStore }

func (c storeClock) Now() time.Time { return time.UnixMilli(c.s.now) }

// keysHolding is a key service over a store of its own in which owner "a"
// holds key "k".
func keysHolding(t *testing.T) (*fsmStore, *Keys, *fsm.LeaseInfo) {
	t.Helper()
	st := newFSMStore(t)
	k := storeKeys(st, st)
	l, err := k.Acquire(context.Background(), AcquireParams{Key: "k", Owner: "a", BlockSecs: -1})
	if err != nil {
		t.Fatal(err)
	}
	return st, k, l
}

// storeKeys is a key service of server n1 over st, whose clock is base's.
func storeKeys(st Store, base *fsmStore) *Keys {
	return NewKeys(st, NewWaits(), storeClock{base}, Limits{DefaultTTL: 30 * time.Second, MaxTTL: time.Hour,
		MaxBlock: time.Minute, MaxStateBytes: 1 << 20}, Server{ID: "n1"})
}

// A blocked acquire whose proposal fails after it was applied leaves the
// key's queue: the next release does not hand the key to nobody.
func TestFailedBlockedAcquireLeavesTheQueue(t *testing.T) {
	base := newFSMStore(t)
	st := &lostAnswerStore{fsmStore: base}
	k := storeKeys(st, base)
	ctx := context.Background()
	a, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "a", BlockSecs: -1})
	if err != nil {
		t.Fatal(err)
	}
	st.lose = fsm.OpAcquire
	if _, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "b", BlockSecs: 30}); err == nil {
		t.Fatal("the lost acquire succeeded")
	}
	var rec fsm.KeyRecord
	_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Waiters != 0 {
		t.Fatalf("the failed acquire is still queued: %+v", rec)
	}
	if _, err := st.Propose(ctx, &fsm.Command{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{Namespace: "default", Key: "k",
		LeaseID: a.LeaseID, TxnID: a.TxnID}}); err != nil {
		t.Fatal(err)
	}
	_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Lease != nil {
		t.Fatalf("the key went to the abandoned request of %s", rec.Lease.Owner)
	}
	// A refusal of the state machine queued nothing: no withdrawal is sent.
	cancels := st.proposed[fsm.OpCancelWait]
	mustLease := func(_ *fsm.LeaseInfo, err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	mustLease(k.Acquire(ctx, AcquireParams{Key: "k", Owner: "c", BlockSecs: -1}))
	if _, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "d", BlockSecs: 30, IfNotExists: true}); err == nil {
		t.Fatal("if_not_exists on a held key succeeded")
	}
	if st.proposed[fsm.OpCancelWait] != cancels {
		t.Fatalf("a refused acquire was withdrawn: %d cancels, want %d", st.proposed[fsm.OpCancelWait], cancels)
	}
}

// A waiting dequeue whose proposal fails after it was applied leaves the
// queue's consumers: the next message stays ready.
func TestFailedWaitingDequeueLeavesTheQueue(t *testing.T) {
	base := newFSMStore(t)
	st := &lostAnswerStore{fsmStore: base, lose: fsm.OpDequeue}
	q := NewQueues(st, NewWaits(), storeClock{base}, QueueLimits{MaxWait: time.Minute}, Server{ID: "n1"}, nil)
	ctx := context.Background()
	if _, err := q.Dequeue(ctx, DequeueParams{Queue: "q", Owner: "c", WaitSeconds: 30}); err == nil {
		t.Fatal("the lost dequeue succeeded")
	}
	if _, err := q.Enqueue(ctx, EnqueueParams{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	var s fsm.QueueStats
	_ = base.f.View(func(v *fsm.View) error { s = v.QueueStats("default", "q"); return nil })
	if s.Ready != 1 || s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("the message went to the abandoned dequeue: %+v", s)
	}
}

// A waiting request whose command never reached a leader (none was
// elected in time) stands in no line: it answers no_leader at once,
// without waiting for a leader a second time to withdraw.
func TestWaitingRequestsWithoutALeaderWithdrawNothing(t *testing.T) {
	base := newFSMStore(t)
	st := &lostAnswerStore{fsmStore: base, noLeader: true}
	ctx := context.Background()
	k := storeKeys(st, base)
	if _, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "a", BlockSecs: 30}); !errors.Is(err, errcode.NoLeader) {
		t.Fatalf("acquire without a leader: %v", err)
	}
	q := NewQueues(st, NewWaits(), storeClock{base}, QueueLimits{MaxWait: time.Minute}, Server{ID: "n1"}, nil)
	if _, err := q.Dequeue(ctx, DequeueParams{Queue: "q", Owner: "c", WaitSeconds: 30}); !errors.Is(err, errcode.NoLeader) {
		t.Fatalf("dequeue without a leader: %v", err)
	}
	if st.proposed[fsm.OpAcquire] != 1 || st.proposed[fsm.OpDequeue] != 1 || st.proposed[fsm.OpCancelWait] != 0 {
		t.Fatalf("proposed %v, want one acquire, one dequeue and no withdrawal", st.proposed)
	}
}

// A rollback that reaches this island before the coordinator's prepare is
// recorded, so the late prepare answers with it instead of locking keys
// for a transaction the coordinator already counted as done here.
func TestRollbackBeforeItsPrepareIsKept(t *testing.T) {
	s := newFSMStore(t)
	e := NewEnlisted(s, s, storeClock{s}, 30*time.Second)
	ctx := context.Background()
	txn := xid.New().String()
	ps := []fsm.Participant{{Namespace: "default", Key: "k"}}
	info, err := e.Apply(ctx, Coordinated{TxnID: txn, State: fsm.TxnRollback, Home: "island-h", Term: 1, Participants: ps})
	if err != nil || info.State != fsm.TxnRollback {
		t.Fatalf("rollback: %+v %v", info, err)
	}
	info, err = e.Prepare(ctx, Coordinated{TxnID: txn, Home: "island-h", Term: 1,
		ExpiresAt: time.UnixMilli(s.now).Add(time.Hour), Participants: ps})
	if err != nil || info.State != fsm.TxnRollback {
		t.Fatalf("late prepare: %+v %v, want the rollback", info, err)
	}
	k := storeKeys(s, s)
	if _, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "x", BlockSecs: -1}); err != nil {
		t.Fatalf("the key is locked by the late prepare: %v", err)
	}
}

// A multi-record creation whose lock entry was applied but whose answer
// was lost (its client went away while a follower forwarded it) releases
// the lock: the client's retry creates the transaction instead of being
// told, for the lock's lifetime, that a transaction with no record exists.
func TestUTXOCreateWhoseLockAnswerWasLostReleasesTheLock(t *testing.T) {
	base := newFSMStore(t)
	st := &lostAnswerStore{fsmStore: base}
	u := NewUTXOs(st, base, UTXOLimits{BatchSize: 3})
	ctx := context.Background()
	req := tx("lost", 8)
	st.lose = fsm.OpUTXOCreate // the first step: the lock
	if _, err := u.Create(ctx, req); err == nil {
		t.Fatal("the create whose answer was lost succeeded")
	}
	if _, err := u.Create(ctx, req); err != nil {
		t.Fatalf("retry of the create whose lock answer was lost: %v", err)
	}
	got, err := u.Get(ctx, req.TxID, Linearizable)
	if err != nil || got.Creating || got.Records != 3 || len(got.Outputs) != 8 {
		t.Fatalf("after the retry: %+v, %v", got, err)
	}
}

// A spend that meets an abandoned creation takes its lock to complete it;
// when the answer to that lock is lost, the lock is released too, so that
// the creator's retry is not refused while it lives.
func TestUTXORecoveryWhoseLockAnswerWasLostReleasesTheLock(t *testing.T) {
	base := newFSMStore(t)
	st := &lostAnswerStore{fsmStore: base}
	u := NewUTXOs(st, base, UTXOLimits{BatchSize: 3})
	ctx := context.Background()
	req := tx("abandoned", 8)
	u.step = func(_ context.Context, s string) error {
		if s == "phase1" {
			return errors.New("crashed after phase 1")
		}
		return nil
	}
	if _, err := u.Create(ctx, req); err == nil {
		t.Fatal("the crashed create succeeded")
	}
	u.step = nil
	base.advance(UTXOLockTTL(3).Milliseconds() + 1)
	st.lose = fsm.OpUTXOCreate // the recovery's lock
	_, err := u.Spend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("abandoned", 0, "c", 0)}})
	if !errors.Is(err, errcode.UTXOSpendFailed) {
		t.Fatalf("spend whose recovery lost its lock answer: %v", err)
	}
	if _, err := u.Create(ctx, req); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("the creator's retry: %v, want tx_exists after completing the creation", err)
	}
	if got, err := u.Get(ctx, req.TxID, Linearizable); err != nil || got.Creating || len(got.RecordsCreating) != 0 {
		t.Fatalf("after the retry: %+v, %v", got, err)
	}
}

// lateLockStore fails the next lock of a UTXO creation at once, as a
// follower's forward does when its caller goes away before the leader took
// the command up: the leader applies the lock when the caller awaits the
// answer (the error's AwaitAnswer), or else just after the next command
// it is sent, which it may take up first.
type lateLockStore struct {
	*fsmStore
	mu   sync.Mutex
	hold bool
	held *fsm.Command
}

// unanswered is the error of a forward whose answer has not come yet.
type unanswered struct{ s *lateLockStore }

func (unanswered) Error() string                     { return "forward to the leader: context canceled" }
func (e unanswered) AwaitAnswer(ctx context.Context) { e.s.applyHeld(ctx) }

func (s *lateLockStore) applyHeld(ctx context.Context) {
	s.mu.Lock()
	cmd := s.held
	s.held = nil
	s.mu.Unlock()
	if cmd != nil {
		_, _ = s.fsmStore.Propose(ctx, cmd)
	}
}

func (s *lateLockStore) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	s.mu.Lock()
	if s.hold && cmd.Op == fsm.OpUTXOCreate && cmd.UTXOCreate.Phase == fsm.UTXOPhaseLock {
		s.hold, s.held = false, cmd
		s.mu.Unlock()
		return nil, unanswered{s}
	}
	s.mu.Unlock()
	res, err := s.fsmStore.Propose(ctx, cmd)
	s.applyHeld(ctx)
	return res, err
}

// A creation whose lock entry's answer was lost before the leader took the
// entry up waits for that answer before it releases the lock: a release
// applied first would find no lock, and the lock applied after it would
// refuse the client's retry with tx_exists while it lives.
func TestUTXOCreateReleasesALockTakenAfterItsAnswerWasLost(t *testing.T) {
	base := newFSMStore(t)
	st := &lateLockStore{fsmStore: base, hold: true}
	u := NewUTXOs(st, base, UTXOLimits{BatchSize: 3})
	ctx := context.Background()
	req := tx("late", 8)
	if _, err := u.Create(ctx, req); err == nil {
		t.Fatal("the create whose answer was lost succeeded")
	}
	if _, err := u.Create(ctx, req); err != nil {
		t.Fatalf("retry of the create whose lock was taken after its answer was lost: %v", err)
	}
}
