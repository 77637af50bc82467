package testcluster

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// A backup taken with work in progress brings it back on every node, and
// it keeps working: a lease held then is held again with its staged write,
// a transaction's staged write commits with its decision, a delivery in
// flight is acked with its token. A queued acquirer and a waiting consumer
// whose requests ended after the backup are withdrawn by the server they
// waited on, instead of being handed the key, or a message, for a client
// that is gone.
func TestRestoreBringsBackWorkInProgressOnEveryNode(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	l := c.WaitLeader(10 * time.Second)
	rest := others(c, l)
	f, g := rest[0], rest[1]
	cl := c.RetryingClient(l)

	held := acquire(t, cl, "held", 60)
	if _, err := held.Update(ctx, []byte(`{"v":"staged"}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	granted := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Client(f).Acquire(ctx, wire.AcquireRequest{Key: "held", Owner: "w", TTLSeconds: 30, BlockSecs: 60})
		if err != nil {
			t.Errorf("queued acquire: %v", err)
		}
		granted <- l
	}()
	waitQueued(t, cl, "held", 1)
	delivered := make(chan *client.Delivery, 1)
	go func() {
		d, err := c.Client(f).Dequeue(ctx, wire.DequeueRequest{Queue: "empty", Owner: "w", WaitSeconds: 60})
		if err != nil {
			t.Errorf("waiting dequeue: %v", err)
		}
		delivered <- d
	}()
	waitConsumers := func(n int) {
		t.Helper()
		waitFor(t, 10*time.Second, "the consumers waiting on the empty queue", func() bool {
			st, err := cl.QueueStats(ctx, "", "empty", false)
			return err == nil && st.WaitingConsumers == n
		})
	}
	waitConsumers(1)
	txn := xid.New().String()
	inTxn, err := cl.Acquire(ctx, wire.AcquireRequest{Key: "t", Owner: "t", TTLSeconds: 60, TxnID: txn})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inTxn.Update(ctx, []byte(`{"t":1}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Enqueue(ctx, wire.EnqueueRequest{Queue: "q"}, []byte("m1")); err != nil {
		t.Fatal(err)
	}
	inFlight, err := cl.Dequeue(ctx, wire.DequeueRequest{Queue: "q", Owner: "c", VisibilityTimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}

	var backup bytes.Buffer
	if _, err := c.Operator(f).SaveSnapshot(ctx, &backup, nil); err != nil {
		t.Fatal(err)
	}

	// After the backup the lease is released, the queued acquirer served,
	// the waiting consumer handed a message, the delivery acked.
	if err := held.Release(ctx, false); err != nil {
		t.Fatal(err)
	}
	w := <-granted
	if w == nil {
		t.Fatal("no lease for the queued acquirer")
	}
	commit(t, w, `{"v":"w"}`)
	if _, err := cl.Enqueue(ctx, wire.EnqueueRequest{Queue: "empty"}, []byte("first")); err != nil {
		t.Fatal(err)
	}
	d := <-delivered
	if d == nil {
		t.Fatal("no message for the waiting consumer")
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inFlight.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	lastHeld := acquire(t, cl, "held", 30)
	commit(t, lastHeld, `{"v":"last"}`)

	res, err := c.Operator(g).RestoreSnapshot(ctx, bytes.NewReader(backup.Bytes()), int64(backup.Len()), nil)
	if err != nil || !res.Restored {
		t.Fatalf("restore: %+v %v", res, err)
	}
	// Nobody waits for the key or the queue any more.
	waitQueued(t, cl, "held", 0)
	waitConsumers(0)
	c.WaitConverged(10 * time.Second)

	// The lease held at backup time is held again, with its staged write.
	if err := held.Release(ctx, false); err != nil {
		t.Fatalf("release of the lease held at backup time: %v", err)
	}
	if d, err := cl.GetPublic(ctx, "", "held"); err != nil || string(d.Body) != `{"v":"staged"}` {
		t.Fatalf("held after the restored lease's release: %+v %v", d, err)
	}
	// The key is free: the acquirer queued at backup time was not granted it.
	next, err := cl.Acquire(ctx, wire.AcquireRequest{Key: "held", Owner: "n", TTLSeconds: 30, BlockSecs: -1})
	if err != nil {
		t.Fatalf("acquire after the restored lease's release: %v", err)
	}
	if next.FencingToken <= lastHeld.FencingToken {
		t.Fatalf("token %d after the restore, %d before it", next.FencingToken, lastHeld.FencingToken)
	}
	// A message enqueued now goes to a consumer asking now.
	if _, err := cl.Enqueue(ctx, wire.EnqueueRequest{Queue: "empty"}, []byte("second")); err != nil {
		t.Fatal(err)
	}
	if d, err := cl.Dequeue(ctx, wire.DequeueRequest{Queue: "empty", Owner: "n"}); err != nil || string(d.Payload) != "second" {
		t.Fatalf("dequeue after the restore: %+v %v", d, err)
	}
	// The transaction's staged write commits with its decision.
	if _, err := c.Operator(l).TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}); err != nil {
		t.Fatalf("decide: %v", err)
	}
	waitFor(t, 10*time.Second, "the transaction's write", func() bool {
		d, err := cl.GetPublic(ctx, "", "t")
		return err == nil && string(d.Body) == `{"t":1}`
	})
	// The delivery in flight at backup time is acked with its token.
	if err := inFlight.Ack(ctx); err != nil {
		t.Fatalf("ack of the delivery in flight at backup time: %v", err)
	}
	c.WaitConverged(10 * time.Second)
}
