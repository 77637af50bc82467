package tc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

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
