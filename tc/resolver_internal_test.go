package tc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// decisionRemote is another island that prepares and applies every
// decision it is sent, and records the applies. The first apply runs
// during before it answers, and fails with failFirst when that is set.
type decisionRemote struct {
	Remote
	mu        sync.Mutex
	applies   []wire.TxnDecisionRequest
	during    func()
	failFirst error
}

func (r *decisionRemote) Prepare(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: fsm.TxnPending}, nil
}

func (r *decisionRemote) Apply(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	r.applies = append(r.applies, req)
	during, fail := r.during, r.failFirst
	r.during, r.failFirst = nil, nil
	r.mu.Unlock()
	if during != nil {
		during()
	}
	if fail != nil {
		return wire.TxnDecisionResponse{}, fail
	}
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: req.State}, nil
}

func (r *decisionRemote) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applies)
}

// A decision a request is sending to the other islands is not sent again
// by the resolver, which the same decision wakes: a round that runs while
// the request's apply is in flight leaves it alone. When the request's
// fan-out fails, the next round replays it.
func TestResolverLeavesADecisionToTheRequestFanningItOut(t *testing.T) {
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	remote := &decisionRemote{}
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store,
		Config{FanoutAttempts: 1, FanoutBaseDelay: time.Millisecond, FanoutMaxDelay: time.Millisecond})
	ctx := context.Background()
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	r := NewResolver(c, 0, 0)
	round := func() { r.round(ctx, map[string]retry{}) }
	commit := func(txn string) error {
		_, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnCommit,
			Participants: []fsm.Participant{{Namespace: "default", Key: "k-" + txn, Backend: "b"}}})
		return err
	}

	remote.during = round
	if err := commit("d0jvq8g3u3l3ohf7m6c0"); err != nil {
		t.Fatal(err)
	}
	if n := remote.count(); n != 1 {
		t.Fatalf("the decision was sent %d times, want once", n)
	}

	remote.during, remote.failFirst = round, errors.New("connection refused")
	if err := commit("d0jvq8g3u3l3ohf7m6cg"); err == nil {
		t.Fatal("a commit whose fan-out failed answered success")
	}
	if n := remote.count(); n != 2 {
		t.Fatalf("%d applies after the failed fan-out, want 2", n)
	}
	round()
	if n := remote.count(); n != 3 {
		t.Fatalf("%d applies after the next round, want the replay (3)", n)
	}
}

// downRemote is an island that prepared what it was asked to and then
// stopped answering: every apply and every registration fails, and is
// counted.
type downRemote struct {
	Remote
	mu                 sync.Mutex
	applies, registers int
}

func (r *downRemote) Prepare(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: fsm.TxnPending}, nil
}

func (r *downRemote) Apply(context.Context, string, wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applies++
	return wire.TxnDecisionResponse{}, errors.New("connection refused")
}

func (r *downRemote) Register(context.Context, string, wire.TCRMRegisterRequest, bool) (wire.TCRMRegisterResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registers++
	return wire.TCRMRegisterResponse{}, errors.New("connection refused")
}

func (r *downRemote) counts() (applies, registers int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applies, r.registers
}

// islandWithDownPeer is a coordinator of island a whose peer island b
// answers nothing.
func islandWithDownPeer(t *testing.T) (*Coordinator, *downRemote) {
	t.Helper()
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	remote := &downRemote{}
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store,
		Config{FanoutAttempts: 1, FanoutBaseDelay: time.Millisecond, FanoutMaxDelay: time.Millisecond})
	if _, err := c.Register(context.Background(), fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	return c, remote
}

// Decisions that requests are fanning out do not fill the resolver's
// batch: with a whole batch of them due first, a round still reaches the
// decision after them, and does not ask to run again at once.
func TestDecisionsBeingFannedOutDoNotFillTheResolversBatch(t *testing.T) {
	c, remote := islandWithDownPeer(t)
	ctx := context.Background()
	var ids []string
	for range 65 {
		id := xid.New().String()
		if _, err := c.Decide(ctx, Decision{TxnID: id, State: fsm.TxnCommit,
			Participants: []fsm.Participant{{Namespace: "default", Key: "k-" + id, Backend: "b"}}}); err == nil {
			t.Fatal("a decision reached an island that answers nothing")
		}
		ids = append(ids, id)
	}
	for _, id := range ids[:64] {
		c.fanning.Store(id, struct{}{})
	}
	before, _ := remote.counts()
	next := NewResolver(c, time.Second, 0).round(ctx, map[string]retry{})
	if after, _ := remote.counts(); after != before+1 {
		t.Fatalf("the round sent %d decisions, want the one no request was fanning out", after-before)
	}
	if now := c.clock.Now(); !next.After(now) {
		t.Fatalf("the round asks for the next at %v, not after now (%v): it would spin", next, now)
	}
}

// A registry sync that fails is tried again after a pause (a second, then
// growing up to the registry interval), not at every round: each would
// wait for the island that does not answer.
func TestAFailedRegistrySyncIsTriedAgainAfterAPause(t *testing.T) {
	c, remote := islandWithDownPeer(t)
	if err := c.SyncRegistry(context.Background()); err == nil {
		t.Fatal("a sync with an island that answers nothing succeeded")
	}
	_, perSync := remote.counts()
	r := NewResolver(c, 5*time.Millisecond, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r.run(ctx)
	if _, registers := remote.counts(); registers != 2*perSync || r.Rounds() < 10 {
		t.Fatalf("%d syncs in %d rounds, want 1", registers/perSync-1, r.Rounds())
	}
}
