package rm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// slowLeaderStore stamps every command with the time it is applied, as a
// leader does. It applies the acquires of owner slow only after delay (a
// forward that waited for a leader to be elected first), and from then on
// fails every withdrawal until healed (a leader that cannot be reached).
type slowLeaderStore struct {
	*fsmStore
	slow  string
	delay time.Duration
	mu    sync.Mutex
	out   bool
}

func (s *slowLeaderStore) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	if cmd.Op == fsm.OpAcquire && cmd.Acquire.Owner == s.slow {
		time.Sleep(s.delay)
	}
	s.mu.Lock()
	out := s.out
	s.mu.Unlock()
	if out && cmd.Op == fsm.OpCancelWait {
		return nil, errcode.NoLeader.With("no leader elected within 1s")
	}
	s.fsmStore.mu.Lock()
	s.fsmStore.now = time.Now().UnixMilli()
	s.fsmStore.mu.Unlock()
	res, err := s.fsmStore.Propose(ctx, cmd)
	if cmd.Op == fsm.OpAcquire && cmd.Acquire.Owner == s.slow {
		s.mu.Lock()
		s.out = true
		s.mu.Unlock()
	}
	return res, err
}

func (s *slowLeaderStore) heal() {
	s.mu.Lock()
	s.out = false
	s.mu.Unlock()
}

// A blocked acquire whose proposal took a while to be applied waits in the
// replicated state until the leader's time then plus its wait, later than
// its wait runs out on its server. A withdrawal that no leader takes is
// tried again until then: a release after the outage does not grant the
// key to the request nobody waits for.
func TestAWithdrawalIsTriedUntilTheReplicatedWaitEnds(t *testing.T) {
	base := newFSMStore(t)
	st := &slowLeaderStore{fsmStore: base, slow: "b", delay: 3 * time.Second}
	k := storeKeys(st, base)
	ctx := context.Background()
	a, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "a", BlockSecs: -1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "b", BlockSecs: 1})
		done <- err
	}()
	// The acquire is applied 3 s on, to wait 1 s more; the leader is
	// out of reach from then on, until the server gives up withdrawing it.
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the acquire got the lease")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the acquire did not end")
	}
	st.heal()
	if _, err := st.Propose(ctx, &fsm.Command{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{Namespace: "default", Key: "k",
		LeaseID: a.LeaseID, TxnID: a.TxnID}}); err != nil {
		t.Fatal(err)
	}
	var rec fsm.KeyRecord
	_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Lease != nil {
		t.Fatalf("the release granted the key to %s, whose request its server stopped withdrawing", rec.Lease.Owner)
	}
}
