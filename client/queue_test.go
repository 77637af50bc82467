package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// A server that cuts every subscription stream at once is asked again, but
// at a bounded pace, not in a tight loop.
func TestSubscriptionReopensACutStreamAtAPace(t *testing.T) {
	opened, err := subscribeUntilDeadline(t, time.Second, false, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "multipart/related; boundary=b")
		w.WriteHeader(http.StatusOK)
		// The stream ends without its closing boundary: cut off.
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscription ended with %v, want it to keep reopening until its context ended", err)
	}
	if n := opened; n < 2 || n > 15 {
		t.Fatalf("the stream was opened %d times in a second, want a few (at most one per 100 ms)", n)
	}
}

// A server that answers a subscription at once with 409 waiting and a
// retry_after_seconds hint (a stateful subscription whose next message's
// sidecar another holder keeps) is asked again after that hint, up to a
// second, not every 100 ms.
func TestSubscriptionWaitsForTheRetryHintOfAWaitingAnswer(t *testing.T) {
	opened, err := subscribeUntilDeadline(t, 2500*time.Millisecond, true, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":"waiting","detail":"state sidecar held","retry_after_seconds":30}`))
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscription ended with %v, want it to keep asking until its context ended", err)
	}
	if n := opened; n < 2 || n > 4 {
		t.Fatalf("the stream was asked for %d times in 2.5 s, want about one a second", n)
	}
}

// subscribeUntilDeadline subscribes (with state when withState) to a server
// that answers every request with answer, for d; it returns how many times
// the server was asked and how the subscription ended.
func subscribeUntilDeadline(t *testing.T, d time.Duration, withState bool, answer func(http.ResponseWriter)) (int64, error) {
	t.Helper()
	var opened atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opened.Add(1)
		answer(w)
	}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req := wire.DequeueRequest{Queue: "q", Owner: "o", WaitSeconds: 5}
	fn := func(*client.Delivery) error { return nil }
	if withState {
		err = c.SubscribeWithState(ctx, req, fn)
	} else {
		err = c.Subscribe(ctx, req, fn)
	}
	return opened.Load(), err
}
