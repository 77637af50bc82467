package rm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
)

// A waiting dequeue on a server whose state is replaced by a snapshot
// (a lagging follower installing the leader's snapshot) proposes its
// dequeue again. When the snapshot covers the step that handed it a
// message, that message is the answer: not a second one, leased under the
// same lease id while the first stays leased to nobody until its lease
// runs out (a failed attempt, with max_attempts 1 a dead letter).
func TestADequeueProposedAgainAfterARestoreAnswersItsDelivery(t *testing.T) {
	base := newFSMStore(t)
	waits := NewWaits() // observes nothing: the delivery's entry came in a snapshot
	q := NewQueues(base, waits, storeClock{base}, QueueLimits{MaxWait: time.Minute}, Server{ID: "n1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := dequeueInBackground(ctx, q)
	waitInLine(ctx, t, q, 1)
	first, err := q.Enqueue(ctx, EnqueueParams{Queue: "q"}) // handed to the waiting dequeue
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, EnqueueParams{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	waits.Observe([]fsm.Event{{Kind: fsm.EventRestored}})
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	st, _ := q.Stats(ctx, "default", "q", Linearizable)
	if got.d.Message.ID != first.ID || st.InFlight != 1 {
		t.Fatalf("dequeue answered %s (first delivered %s); in flight %d", got.d.Message.ID, first.ID, st.InFlight)
	}
}

// A waiting dequeue that was handed nothing in the steps a restore covered
// stands in line again and keeps waiting: the end of its old place in line
// is not taken for the end of its wait.
func TestADequeueProposedAgainAfterARestoreKeepsWaiting(t *testing.T) {
	waits := NewWaits()
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"), fsm.Options{BootID: "b", Observers: []fsm.Observer{waits},
		Fatal: func(err error) { t.Errorf("state machine stopped: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	base := &fsmStore{f: f, now: 1_700_000_000_000}
	q := NewQueues(base, waits, storeClock{base}, QueueLimits{MaxWait: time.Minute}, Server{ID: "n1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := dequeueInBackground(ctx, q)
	waitInLine(ctx, t, q, 1)
	waits.Observe([]fsm.Event{{Kind: fsm.EventRestored}})
	// It leaves the line and stands in it again.
	for {
		select {
		case got := <-done:
			t.Fatalf("the dequeue ended after the restore: %+v %v", got.d, got.err)
		case <-time.After(20 * time.Millisecond):
		}
		base.mu.Lock()
		applied := base.index // the dequeue, its withdrawal, the dequeue again
		base.mu.Unlock()
		if st, _ := q.Stats(ctx, "default", "q", Linearizable); st.Waiting == 1 && applied >= 3 {
			break
		}
	}
	sent, err := q.Enqueue(ctx, EnqueueParams{Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || got.d.Message.ID != sent.ID {
		t.Fatalf("after the restore the dequeue answered %+v %v, want message %s", got.d, got.err, sent.ID)
	}
}

type dequeued struct {
	d   *Delivery
	err error
}

// dequeueInBackground starts a dequeue of queue q that waits up to 10 s.
func dequeueInBackground(ctx context.Context, q *Queues) <-chan dequeued {
	done := make(chan dequeued, 1)
	go func() {
		d, err := q.Dequeue(ctx, DequeueParams{Queue: "q", Owner: "w", WaitSeconds: 10})
		done <- dequeued{d, err}
	}()
	return done
}

// waitInLine waits until n dequeues stand in queue q's line.
func waitInLine(ctx context.Context, t *testing.T, q *Queues, n int) {
	t.Helper()
	for {
		st, err := q.Stats(ctx, "default", "q", Linearizable)
		if err != nil {
			t.Fatalf("waiting for %d dequeue(s) in line: %v", n, err)
		}
		if st.Waiting == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
