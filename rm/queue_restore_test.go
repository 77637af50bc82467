package rm

import (
	"context"
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
	type out struct {
		d   *Delivery
		err error
	}
	done := make(chan out, 1)
	go func() {
		d, err := q.Dequeue(ctx, DequeueParams{Queue: "q", Owner: "w", WaitSeconds: 10})
		done <- out{d, err}
	}()
	for {
		st, err := q.Stats(ctx, "default", "q", Linearizable)
		if err != nil {
			t.Fatalf("waiting for the dequeue to stand in line: %v", err)
		}
		if st.Waiting == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
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
