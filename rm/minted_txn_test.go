package rm

import (
	"context"
	"testing"
	"time"

	"github.com/rs/xid"
)

// The transaction an acquire without one is given is dated by the
// server's clock as its peers corrected it, which the state machine
// judges a forgotten transaction by, not by its own wall clock.
func TestAnAcquiresTransactionIsDatedByTheServersCorrectedClock(t *testing.T) {
	st, k, l := keysHolding(t)
	id, err := xid.FromString(l.TxnID)
	if err != nil {
		t.Fatalf("txn_id %q: %v", l.TxnID, err)
	}
	if want := k.clock.Now().Truncate(time.Second); !id.Time().Equal(want) {
		t.Fatalf("transaction %s is dated %v, want the server's clock's %v (the store's at %d ms)", l.TxnID, id.Time(), want, st.now)
	}
}

// The transaction a stateful dequeue without one gives the message's state
// sidecar, which the consumer may carry to other islands, is dated by the
// server's corrected clock too.
func TestAStatefulDequeuesTransactionIsDatedByTheServersCorrectedClock(t *testing.T) {
	st := newFSMStore(t)
	q := NewQueues(st, NewWaits(), storeClock{st}, QueueLimits{MaxWait: time.Minute}, Server{ID: "n1"}, nil)
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, EnqueueParams{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	d, err := q.Dequeue(ctx, DequeueParams{Queue: "q", Owner: "c", WithState: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Message.State == nil {
		t.Fatalf("no sidecar lease: %+v", d.Message)
	}
	id, err := xid.FromString(d.Message.State.TxnID)
	if err != nil {
		t.Fatalf("state txn %q: %v", d.Message.State.TxnID, err)
	}
	if want := time.UnixMilli(st.now).Truncate(time.Second); !id.Time().Equal(want) {
		t.Fatalf("the sidecar's transaction %s is dated %v, want the server's clock's %v", d.Message.State.TxnID, id.Time(), want)
	}
}
