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

// islandsRemote answers for two islands reached at https://slow and
// https://b: "slow" fails at once until hang is set and then never answers
// (every call waits for its deadline), "b" fails at once while down and
// applies every decision after that.
type islandsRemote struct {
	Remote
	mu      sync.Mutex
	hang    bool
	hangReg bool // registrations with slow wait too, once hang is set
	bDown   bool
	hung    chan struct{} // closed once a call to slow waits
	applied map[string]time.Time
}

func (r *islandsRemote) Prepare(_ context.Context, _ string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: fsm.TxnPending}, nil
}

func (r *islandsRemote) Register(ctx context.Context, ep string, _ wire.TCRMRegisterRequest, _ bool) (wire.TCRMRegisterResponse, error) {
	r.mu.Lock()
	hang := r.hang && r.hangReg
	r.mu.Unlock()
	if ep == "https://slow" && hang {
		<-ctx.Done()
		return wire.TCRMRegisterResponse{}, ctx.Err()
	}
	return wire.TCRMRegisterResponse{}, nil
}

func (r *islandsRemote) Apply(ctx context.Context, ep string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	hang, down := r.hang, r.bDown
	r.mu.Unlock()
	switch {
	case ep == "https://slow" && hang:
		select {
		case <-r.hung:
		default:
			close(r.hung)
		}
		<-ctx.Done()
		return wire.TxnDecisionResponse{}, ctx.Err()
	case ep == "https://slow", down:
		return wire.TxnDecisionResponse{}, errors.New("connection refused")
	}
	r.mu.Lock()
	r.applied[req.TxnID] = time.Now()
	r.mu.Unlock()
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: req.State}, nil
}

// An island that stops answering holds up only the replays it is part of:
// a decision for a healthy island that falls to the resolver while a
// replay to the silent island waits for its deadline is replayed at once,
// not after that deadline.
func TestASilentIslandDoesNotHoldUpTheReplaysOfOthers(t *testing.T) {
	replayBesideASilentIsland(t, false)
}

// Nor does the registry sync, which tells the silent island too.
func TestASilentIslandsRegistrySyncDoesNotHoldUpTheReplaysOfOthers(t *testing.T) {
	replayBesideASilentIsland(t, true)
}

func replayBesideASilentIsland(t *testing.T, hangRegistrations bool) {
	store := newApplyStore(t, time.UnixMilli(50_000_000))
	remote := &islandsRemote{bDown: true, hangReg: hangRegistrations, hung: make(chan struct{}), applied: map[string]time.Time{}}
	const deadline = 3 * time.Second
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store,
		Config{FanoutAttempts: 1, FanoutTimeout: deadline, FanoutBaseDelay: time.Millisecond, FanoutMaxDelay: time.Millisecond})
	ctx := context.Background()
	for _, isl := range []struct{ backend, ep string }{{"slow", "https://slow"}, {"b", "https://b"}} {
		if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: isl.backend, Endpoint: isl.ep, PassedOn: true, ChangedAt: 1_000}); err != nil {
			t.Fatal(err)
		}
	}
	decide := func(backend string) string {
		id := xid.New().String()
		if _, err := c.Decide(ctx, Decision{TxnID: id, State: fsm.TxnCommit,
			Participants: []fsm.Participant{{Namespace: "default", Key: "k-" + id, Backend: backend}}}); err == nil {
			t.Fatalf("the fan-out to island %s succeeded", backend)
		}
		return id
	}
	decide("slow") // left to the resolver
	remote.mu.Lock()
	remote.hang = true
	remote.mu.Unlock()

	// Registrations are synced at every round (the registry interval is
	// shorter than one).
	registry := time.Hour
	if hangRegistrations {
		registry = time.Nanosecond
	}
	r := NewResolver(c, 20*time.Millisecond, registry)
	r.SetLeader(true)
	defer r.Stop()
	select {
	case <-remote.hung:
	case <-time.After(5 * time.Second):
		t.Fatal("the resolver never replayed the decision for the silent island")
	}

	// A decision for b, whose fan-out fails while b is down, falls to the
	// resolver; b comes back at once.
	id := decide("b")
	remote.mu.Lock()
	remote.bDown = false
	remote.mu.Unlock()
	r.Kick()
	start := time.Now()
	for {
		remote.mu.Lock()
		at, ok := remote.applied[id]
		remote.mu.Unlock()
		if ok {
			if took := at.Sub(start); took > deadline/3 {
				t.Fatalf("the replay to island b waited %s, for the silent island's deadline (%s)", took.Round(time.Millisecond), deadline)
			}
			return
		}
		if time.Since(start) > 2*deadline {
			t.Fatal("the decision was never replayed to island b")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
