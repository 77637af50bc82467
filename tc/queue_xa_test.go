package tc_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

func msgPart(queue, id string, is *island) wire.TxnParticipant {
	return wire.TxnParticipant{Namespace: wire.DefaultNamespace, Key: "q/" + queue + "/msg/" + id, BackendHash: is.hash()}
}

func enqueue(t *testing.T, c *client.Client, queue, txn, body string) string {
	t.Helper()
	out, err := c.Enqueue(context.Background(), wire.EnqueueRequest{Queue: queue, TxnID: txn}, []byte(body))
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return out.MessageID
}

func dequeue(t *testing.T, c *client.Client, queue, txn string) *client.Delivery {
	t.Helper()
	d, err := c.Dequeue(context.Background(), wire.DequeueRequest{Queue: queue, Owner: "w", TxnID: txn})
	if err != nil || d == nil {
		t.Fatalf("dequeue %s: %v", queue, err)
	}
	return d
}

func queueEmpty(t *testing.T, c *client.Client, queue string) bool {
	t.Helper()
	d, err := c.Dequeue(context.Background(), wire.DequeueRequest{Queue: queue, Owner: "probe", WaitSeconds: wire.BlockNoWait})
	if err == nil && d != nil {
		t.Fatalf("%s is not empty: %+v", queue, d.Message)
	}
	var ce *client.Error
	return d == nil && (err == nil || errors.As(err, &ce))
}

func stats(t *testing.T, c *client.Client, queue string) *wire.QueueStatsResponse {
	t.Helper()
	st, err := c.QueueStats(context.Background(), "", queue, false)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Queue messages take part in transactions across islands like keys: an
// enqueue on one island appears only when the coordinator on another
// commits, and vanishes when it rolls back; a dequeue is acknowledged by
// the commit and returned by the rollback.
func TestQueueMessagesInTransactionsAcrossIslands(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()

	// Transactional enqueue on b, key on a, committed by a.
	txn := xid.New().String()
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"sent":1}`)
	id := enqueue(t, b.client(), "out", txn, "hello")
	if st := stats(t, b.client(), "out"); st.Available {
		t.Fatal("a transactional enqueue is visible before commit")
	}
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a), msgPart("out", id, b)}}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if d := dequeue(t, b.client(), "out", ""); d.Message.MessageID != id || string(d.Payload) != "hello" {
		t.Fatalf("committed enqueue: %+v %q", d.Message, d.Payload)
	} else if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}

	// ... and rolled back: it never appears.
	txn = xid.New().String()
	id = enqueue(t, b.client(), "out", txn, "never")
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback,
		Participants: []wire.TxnParticipant{msgPart("out", id, b)}}); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if !queueEmpty(t, b.client(), "out") {
		t.Fatal("a rolled back enqueue appeared")
	}

	// Transactional dequeue on b with a key on a: the commit acknowledges.
	enqueue(t, b.client(), "in", "", "job-1")
	txn = xid.New().String()
	d := dequeue(t, b.client(), "in", txn)
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"done":"job-1"}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a), msgPart("in", d.Message.MessageID, b)}}); err != nil {
		t.Fatalf("commit dequeue: %v", err)
	}
	if st := stats(t, b.client(), "in"); st.Available || st.HeadMessageID != "" {
		t.Fatalf("the committed delivery is still queued: %+v", st)
	}
	if publicDoc(t, a.client(), "ka") != `{"done":"job-1"}` {
		t.Fatal("the key did not commit with the delivery")
	}

	// A nack of a delivery whose transaction another island coordinates
	// goes to that coordinator, which rolls the whole transaction back.
	enqueue(t, b.client(), "in", "", "job-2")
	txn = xid.New().String()
	d = dequeue(t, b.client(), "in", txn)
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"done":"job-2"}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), msgPart("in", d.Message.MessageID, b)}}); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if _, err := d.Nack(ctx, wire.NackIntentFailure, 0, nil); err != nil {
		t.Fatalf("nack through the coordinator: %v", err)
	}
	if r := a.record(txn); r == nil || r.State != "rollback" {
		t.Fatalf("the coordinator must record the rollback: %+v", r)
	}
	testutil.WaitFor(t, 10*time.Second, "job-2 to be ready again", func() bool {
		return stats(t, b.client(), "in").Available
	})
	again := dequeue(t, b.client(), "in", "")
	if again.Message.MessageID != d.Message.MessageID || again.Message.FailureAttempts != 1 {
		t.Fatalf("redelivery: %+v", again.Message)
	}
	if publicDoc(t, a.client(), "ka") != `{"done":"job-1"}` {
		t.Fatal("the rolled back key changed")
	}
	// A stale consumer of the earlier delivery is refused.
	err := d.Ack(ctx)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict || ce.Envelope.Code != "queue_message_lease_mismatch" {
		t.Fatalf("stale ack: %v", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	clean(t, a, b)
}

// A stateful delivery's sidecar, written in the sidecar's own transaction,
// which then takes in a key on another island and is prepared by that
// island's coordinator: the delivery cannot decide the transaction (an ack
// is 409 txn_pending), and when the delivery's lease runs out the message
// goes back to its queue while the sidecar waits for the coordinator, whose
// commit then reaches both islands.
func TestACoordinatedSidecarIsDecidedOnlyByItsCoordinator(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	enqueue(t, b.client(), "jobs", "", "job")
	d, err := b.client().DequeueWithState(ctx, wire.DequeueRequest{Queue: "jobs", Owner: "w", VisibilityTimeoutSeconds: 1})
	if err != nil || d == nil {
		t.Fatalf("dequeue: %v", err)
	}
	ref, _ := d.StateRef()
	if _, err := b.client().Update(ctx, ref, []byte(`{"step":1}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	txn := d.Message.StateTxnID
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"a":1}`)
	ps := []wire.TxnParticipant{part("ka", a), {Namespace: wire.DefaultNamespace, Key: ref.Key, BackendHash: b.hash()}}
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: ps}); err != nil || out.State != wire.TxnStatePending {
		t.Fatalf("pending: %+v %v", out, err)
	}
	wantCode(t, d.Ack(ctx), 409, "txn_pending")
	deadline := time.Now().Add(10 * time.Second)
	for stats(t, b.client(), "jobs").Ready != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the delivery's lease ran out, but the message is not back in its queue")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rb := b.record(txn); rb.State != fsm.TxnPending {
		t.Fatalf("b decided the prepared transaction itself: %s (%s)", rb.State, rb.Reason)
	}
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: ps}); err != nil || out.State != wire.TxnStateCommit {
		t.Fatalf("commit: %+v %v", out, err)
	}
	for b.record(txn).State != fsm.TxnCommit {
		if time.Now().After(deadline) {
			t.Fatalf("b did not commit: %+v", b.record(txn))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ka, sc := publicDoc(t, a.client(), "ka"), publicDoc(t, b.client(), ref.Key); ka != `{"a":1}` || sc != `{"step":1}` {
		t.Fatalf("after the commit ka=%q, sidecar=%q", ka, sc)
	}
}

// A nack of a delivery whose transaction spans islands is the rollback of
// that transaction by its coordinator; its answer says where the rollback
// put the message: after its last allowed attempt, in the dead-letter
// queue, not back in its own. So whether the delivery's island is another
// island's participant or the transaction's home.
func TestACoordinatedNackSaysWhereTheMessageWent(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	for _, c := range []struct {
		name       string
		home, keys *island // the coordinating island, and the one holding the key
		queues     *island // the island of the queue
	}{
		{"participant", a, a, b},
		{"home", a, b, a},
	} {
		queue := "in-" + c.name
		if _, err := c.queues.client().Enqueue(ctx, wire.EnqueueRequest{Queue: queue, MaxAttempts: 1}, []byte("job")); err != nil {
			t.Fatal(err)
		}
		txn := xid.New().String()
		d := dequeue(t, c.queues.client(), queue, txn)
		stage(t, acquire(t, c.keys.client(), "k-"+c.name, txn, "w"), `{"done":1}`)
		if _, err := c.home.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
			Participants: []wire.TxnParticipant{part("k-"+c.name, c.keys), msgPart(queue, d.Message.MessageID, c.queues)}}); err != nil {
			t.Fatalf("%s: prepare: %v", c.name, err)
		}
		out, err := d.Nack(ctx, wire.NackIntentFailure, 0, nil)
		if err != nil {
			t.Fatalf("%s: nack: %v", c.name, err)
		}
		if r := c.home.record(txn); r == nil || r.State != fsm.TxnRollback {
			t.Fatalf("%s: the coordinator did not roll back: %+v", c.name, r)
		}
		if st := stats(t, c.queues.client(), queue); st.Ready != 0 || st.DeadLetterReady != 1 {
			t.Fatalf("%s: the message is not dead-lettered: %+v", c.name, st)
		}
		if out.Requeued || out.DeadLetterQueue != queue+".dlq" {
			t.Fatalf("%s: the nack answered %+v for a message moved to %s.dlq", c.name, out, queue)
		}
	}
	clean(t, a, b)
}

// A nack of a delivery whose transaction spans islands requeues the
// message as it asks once the coordinator has rolled the transaction back
// (a deferring nack spends no attempt: with max_attempts 1 the message is
// not dead-lettered), and a nack resent after its answer was lost is
// answered as the first.
func TestACoordinatedNackIsRequeuedAsItAsksAndARetryIsAnsweredAlike(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	testutil.WaitFor(t, 10*time.Second, "b to follow this build's rules", func() bool {
		return b.srv.Node().FSM().Rules() >= fsm.EntryFormat
	})
	ctx := context.Background()
	if _, err := b.client().Enqueue(ctx, wire.EnqueueRequest{Queue: "in", MaxAttempts: 1}, []byte("job")); err != nil {
		t.Fatal(err)
	}
	txn := xid.New().String()
	d := dequeue(t, b.client(), "in", txn)
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"done":1}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), msgPart("in", d.Message.MessageID, b)}}); err != nil {
		t.Fatal(err)
	}
	first, err := d.Nack(ctx, wire.NackIntentDefer, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := stats(t, b.client(), "in"); !first.Requeued || st.Ready != 1 || st.DeadLetterReady != 0 {
		t.Fatalf("the deferring nack answered %+v; the queue: %+v", first, st)
	}
	again, err := d.Nack(ctx, wire.NackIntentDefer, 0, nil)
	if err != nil || again.Requeued != first.Requeued || again.DeadLetterQueue != first.DeadLetterQueue {
		t.Fatalf("the retried nack: %+v %v (the first: %+v)", again, err, first)
	}
	clean(t, a, b)
}
