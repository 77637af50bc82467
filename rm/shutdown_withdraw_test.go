package rm

import (
	"context"
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
