package rm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// A blocked acquire whose client left while no leader could be reached
// tries its withdrawal again until its wait would have run out, but not
// past the server's shutdown: the request's own context ended when its
// client left and shows nothing of the shutdown, which would otherwise
// wait for the retries (and the server's close with it).
func TestAWithdrawalRetriedAfterTheClientLeftStopsAtShutdown(t *testing.T) {
	base, k, _ := keysHolding(t)
	life, shutDown := context.WithCancelCause(context.Background())
	defer shutDown(nil)
	ctx, leave := context.WithCancel(WithServerLife(life, life))
	defer leave()
	done := make(chan error, 1)
	go func() {
		_, err := k.Acquire(ctx, AcquireParams{Key: "k", Owner: "b", BlockSecs: 60})
		done <- err
	}()
	waitUntil(t, "the acquire to wait in line", func() bool {
		var rec fsm.KeyRecord
		_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
		return rec.Waiters == 1
	})
	// The leader is lost, then the client leaves: the withdrawal fails
	// and is tried again.
	withdrawals := make(chan struct{}, 100)
	base.mu.Lock()
	base.refuse = func(cmd *fsm.Command) error {
		if cmd.Op == fsm.OpCancelWait {
			select {
			case withdrawals <- struct{}{}:
			default:
			}
		}
		return errcode.NoLeader.With("no leader elected within 1s")
	}
	base.mu.Unlock()
	leave()
	for range 2 {
		select {
		case <-withdrawals:
		case <-time.After(10 * time.Second):
			t.Fatal("the withdrawal was not tried again")
		}
	}
	shutDown(errcode.ShuttingDown.With("node is shutting down"))
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the acquire whose client left got the lease")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the withdrawal is still tried 5s after the server began shutting down")
	}
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A blocked acquire proposed again after a restore (its first proposal
// queued it) whose new proposal finds no leader, and whose withdrawal then
// fails as the server shuts down, does not answer not_leader: that tells
// the client nothing was done, while its request may still stand in line.
func TestAnAcquireProposedAgainAfterARestoreThatCannotLeaveTheLineIsOfAnUnknownOutcome(t *testing.T) {
	base := newFSMStore(t)
	waits := NewWaits()
	k := NewKeys(base, waits, storeClock{base}, Limits{DefaultTTL: 30 * time.Second, MaxTTL: time.Hour,
		MaxBlock: time.Minute, MaxStateBytes: 1 << 20}, Server{ID: "n1"})
	if _, err := k.Acquire(context.Background(), AcquireParams{Key: "k", Owner: "a", BlockSecs: -1}); err != nil {
		t.Fatal(err)
	}
	life, shutDown := context.WithCancelCause(context.Background())
	defer shutDown(nil)
	done := make(chan error, 1)
	go func() {
		_, err := k.Acquire(WithServerLife(context.Background(), life), AcquireParams{Key: "k", Owner: "b", BlockSecs: 60})
		done <- err
	}()
	waiters := func() int64 {
		var rec fsm.KeyRecord
		_ = base.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
		return rec.Waiters
	}
	waitUntil(t, "the acquire to wait in line", func() bool { return waiters() == 1 })
	base.mu.Lock()
	base.refuse = func(cmd *fsm.Command) error {
		if cmd.Op == fsm.OpCancelWait {
			shutDown(errcode.ShuttingDown.With("node is shutting down"))
			return errcode.ShuttingDown.With("node is shutting down")
		}
		return errcode.NotLeader.With("node n1 is not the leader")
	}
	base.mu.Unlock()
	waits.Observe([]fsm.Event{{Kind: fsm.EventRestored}})
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the acquire did not end")
	}
	if waiters() != 1 {
		t.Fatalf("%d waiters: the request was to stay in line", waiters())
	}
	if errors.Is(err, errcode.NotLeader) || errors.Is(err, errcode.NoLeader) || !errors.Is(err, errcode.Unavailable) {
		t.Fatalf("an acquire that may stand in line answers %v, want %s", err, errcode.Unavailable.Code)
	}
}
