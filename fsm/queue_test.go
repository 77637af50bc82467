package fsm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

func enq(queue, id, body string) *Command {
	return &Command{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: queue, ID: id, Visibility: 10_000,
		MaxAttempts: 2, Payload: []byte(body)}}
}

func deq(queue, req string, wait int64) *Command {
	return &Command{Op: OpDequeue, Dequeue: &DequeueCmd{Namespace: "default", Queue: queue, Owner: "o-" + req,
		RequestID: req, LeaseID: "ql-" + req, Wait: wait, Node: "n2"}}
}

func ref(m *MessageInfo) MessageRef {
	return MessageRef{Namespace: m.Namespace, Queue: m.Queue, ID: m.ID, LeaseID: m.Lease.ID, Token: m.Lease.Token}
}

func mustDeliver(t *testing.T, r *Result) *MessageInfo {
	t.Helper()
	if r.Err != nil || r.Queue == nil || r.Queue.Message == nil || r.Queue.Message.Lease == nil {
		t.Fatalf("expected a delivery, got %+v (err %v)", r, r.Err)
	}
	return r.Queue.Message
}

func (h *harness) stats(queue string) QueueStats {
	var st QueueStats
	_ = h.f.View(func(v *View) error { st = v.QueueStats("default", queue); return nil })
	return st
}

func TestQueueFIFOAckAndStaleDeliveries(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for i := 1; i <= 3; i++ {
		if r := h.one(enq("q", fmt.Sprintf("m%d", i), fmt.Sprintf("body%d", i))); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// A retried enqueue (same id) adds nothing.
	h.one(enq("q", "m1", "body1"))
	if st := h.stats("q"); st.Ready != 3 || st.Head.ID != "m1" {
		t.Fatalf("stats: %+v", st)
	}
	m1 := mustDeliver(t, h.one(deq("q", "r1", 0)))
	m2 := mustDeliver(t, h.one(deq("q", "r2", 0)))
	if m1.ID != "m1" || m2.ID != "m2" || m1.Lease.Token != 1 || m1.Attempts != 1 {
		t.Fatalf("FIFO: %+v %+v", m1, m2)
	}
	var body string
	_ = h.f.View(func(v *View) error { body = string(v.MessageBody("default", "q", "m1")); return nil })
	if body != "body1" {
		t.Fatalf("body %q", body)
	}
	// A stale lease or token is refused and changes nothing.
	bad := ref(m1)
	bad.Token = 7
	wantCode(t, h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: bad}}), errcode.QueueLeaseMismatch)
	bad = ref(m1)
	bad.LeaseID = "other"
	wantCode(t, h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: bad}}), errcode.QueueLeaseMismatch)
	if r := h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(m1)}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	// Another delivery's lease does not find the acknowledged message.
	bad = ref(m1)
	bad.LeaseID, bad.Token = "other", 0
	wantCode(t, h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: bad}}), errcode.QueueMessageNotFound)
	if st := h.stats("q"); st.Ready != 1 || st.InFlight != 1 || st.Head.ID != "m3" {
		t.Fatalf("after ack: %+v", st)
	}
	mustDeliver(t, h.one(deq("q", "r3", 0)))
	wantCode(t, h.one(deq("q", "r4", 0)), errcode.QueueEmpty)
}

func TestWaitingDequeueGetsTheNextMessageInTheSameStep(t *testing.T) {
	h := openHarness(t, t.TempDir())
	if r := h.one(deq("q", "w1", 5_000)); r.Err != nil || !r.Queue.Queued {
		t.Fatalf("wait: %+v", r)
	}
	h.one(deq("q", "w2", 5_000))
	h.rec.events = nil
	h.one(enq("q", "m1", "x"))
	delivered := events(h, EventDelivered)
	if e := delivered["w1"]; e == nil || e.Message.ID != "m1" || e.Node != "n2" || e.Message.Lease.ID != "ql-w1" {
		t.Fatalf("first waiter: %+v", delivered)
	}
	if delivered["w2"] != nil {
		t.Fatal("one message went to two consumers")
	}
	if st := h.stats("q"); st.Waiting != 1 || st.InFlight != 1 {
		t.Fatalf("stats: %+v", st)
	}
	// The second waiter gives up at its deadline.
	h.now += 6_000
	h.rec.events = nil
	h.one(sweep())
	if e := events(h, EventWaitEnded)["w2"]; e == nil || e.Err.Code != errcode.QueueEmpty.Code {
		t.Fatalf("w2: %+v", e)
	}
	// A cancelled waiter is not handed anything.
	h.one(deq("q", "w3", 5_000))
	h.one(&Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "w3"}})
	h.one(enq("q", "m2", "y"))
	if st := h.stats("q"); st.Ready != 1 || st.Waiting != 0 {
		t.Fatalf("after cancel: %+v", st)
	}
}

func TestDelayedEnqueueIsNotReadyBeforeItsDelay(t *testing.T) {
	h := openHarness(t, t.TempDir())
	c := enq("q", "late", "x")
	c.Enqueue.Delay = 2_000
	if r := h.one(c); r.Err != nil || r.Queue.Message.VisibleAt != h.now+2_000 {
		t.Fatalf("delayed enqueue: %+v", r)
	}
	if st := h.stats("q"); st.Ready != 0 || st.Delayed != 1 {
		t.Fatalf("stats during the delay: %+v", st)
	}
	wantCode(t, h.one(deq("q", "r1", 0)), errcode.QueueEmpty)
	// A message enqueued later without a delay goes first.
	h.one(enq("q", "now", "y"))
	if m := mustDeliver(t, h.one(deq("q", "r2", 0))); m.ID != "now" {
		t.Fatalf("delivered %s during the delay of another", m.ID)
	}
	// A waiting consumer is not handed the message before the delay ends,
	// and is handed it by the sweep that ends the delay.
	h.one(deq("q", "w", 5_000))
	h.now += 1_999
	h.rec.events = nil
	h.one(sweep())
	if e := events(h, EventDelivered)["w"]; e != nil {
		t.Fatalf("delivered before its delay ended: %+v", e)
	}
	h.now++
	h.one(sweep())
	if e := events(h, EventDelivered)["w"]; e == nil || e.Message.ID != "late" {
		t.Fatalf("not delivered when its delay ended: %+v", e)
	}
}

func TestNackDelayDeferExpiryAndDeadLetters(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	m := mustDeliver(t, h.one(deq("q", "r1", 0)))
	// Deferred with a delay: not ready until the delay ends, no failure.
	r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true, Delay: 1_000}})
	if r.Err != nil || !r.Queue.Requeued || r.Queue.Message.Failures != 0 {
		t.Fatalf("defer: %+v", r)
	}
	wantCode(t, h.one(deq("q", "r2", 0)), errcode.QueueEmpty)
	h.now += 1_000
	h.one(sweep())
	m = mustDeliver(t, h.one(deq("q", "r3", 0)))
	if m.Attempts != 2 || m.Lease.Token != 2 {
		t.Fatalf("redelivery: %+v", m)
	}
	// The lease runs out: a failed delivery, ready again.
	h.now += 10_000
	h.one(sweep())
	m = mustDeliver(t, h.one(deq("q", "r4", 0)))
	if m.Failures != 1 {
		t.Fatalf("failures after expiry: %+v", m)
	}
	// Extend moves the lease; the old expiry passes harmlessly.
	if r := h.one(&Command{Op: OpQExtend, QExtend: &QueueExtendCmd{MessageRef: ref(m), By: 30_000}}); r.Err != nil ||
		r.Queue.Message.Lease.ExpiresAt != h.now+30_000 {
		t.Fatalf("extend: %+v", r)
	}
	h.now += 10_000
	h.one(sweep())
	if st := h.stats("q"); st.InFlight != 1 {
		t.Fatalf("an extended delivery expired: %+v", st)
	}
	// A second failure is the last one allowed: the message moves to q.dlq.
	r = h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), LastError: []byte(`{"why":"boom"}`)}})
	if r.Err != nil || r.Queue.DeadLetter != "q.dlq" {
		t.Fatalf("dead letter: %+v", r)
	}
	if st := h.stats("q"); st.Ready+st.InFlight+st.Delayed != 0 || st.DeadReady != 1 {
		t.Fatalf("q after the move: %+v", st)
	}
	d := mustDeliver(t, h.one(deq("q.dlq", "r5", 0)))
	var body string
	_ = h.f.View(func(v *View) error { body = string(v.MessageBody("default", "q.dlq", d.ID)); return nil })
	if d.ID != "m1" || body != "x" {
		t.Fatalf("dead letter message: %+v %q", d, body)
	}
}

func TestMessageTTL(t *testing.T) {
	h := openHarness(t, t.TempDir())
	c := enq("q", "m1", "x")
	c.Enqueue.TTL = 1_000
	h.one(c)
	h.now += 1_000
	h.one(sweep())
	if st := h.stats("q"); st.Ready != 0 {
		t.Fatalf("an expired message stayed: %+v", st)
	}
	wantCode(t, h.one(deq("q", "r1", 0)), errcode.QueueEmpty)
}

// A stateful delivery leases the sidecar key with it: a nack keeps what the
// consumer staged there, an ack deletes the sidecar.
func TestStatefulDeliveries(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	c := statefulDeq("q", "r1", "sl-1", "st-1")
	m := mustDeliver(t, h.one(c))
	if m.State == nil || m.State.Key != StateKey("q", "m1") || m.State.LeaseID != "sl-1" {
		t.Fatalf("state lease: %+v", m.State)
	}
	h.one(update(m.State, `{"step":1}`))
	h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
	if d := h.publicDoc(StateKey("q", "m1")); string(d.Bytes) != `{"step":1}` {
		t.Fatalf("nack must keep the sidecar: %q", d.Bytes)
	}
	c = statefulDeq("q", "r2", "sl-2", "st-2")
	m = mustDeliver(t, h.one(c))
	h.one(update(m.State, `{"step":2}`))
	if r := h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(m)}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
		t.Fatalf("ack must delete the sidecar: %q", d.Bytes)
	}
	if n := stagedCount(h); n != 0 {
		t.Fatalf("%d staged writes left", n)
	}
}

// A stateful delivery enlisted in a transaction: the sidecar is leased in
// the transaction, commit acknowledges the message and deletes the sidecar
// (with what was staged in it), rollback returns the message and keeps the
// sidecar as it was committed before.
func TestStatefulDeliveryInATransaction(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	dequeue := func(req, txn string) *MessageInfo {
		c := deq("q", req, 0)
		c.Dequeue.TxnID, c.Dequeue.WithState, c.Dequeue.StateLease = txn, true, "sl-"+req
		m := mustDeliver(t, h.one(c))
		if m.State == nil || m.State.TxnID != txn {
			t.Fatalf("the sidecar must be leased in %s: %+v", txn, m.State)
		}
		return m
	}
	// A first, plain stateful delivery commits a sidecar document.
	c := statefulDeq("q", "r0", "sl-r0", "st-0")
	m := mustDeliver(t, h.one(c))
	h.one(update(m.State, `{"step":0}`))
	h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})

	m = dequeue("r1", "t1")
	h.one(update(m.State, `{"step":1}`))
	if r := h.one(release(m.State, true)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if tr := txnOf(h, "t1"); tr == nil || tr.State != TxnRollback {
		t.Fatalf("t1: %+v", tr)
	}
	if st := h.stats("q"); st.Ready != 1 || st.InFlight != 0 {
		t.Fatalf("rollback must return the message: %+v", st)
	}
	if d := h.publicDoc(StateKey("q", "m1")); string(d.Bytes) != `{"step":0}` {
		t.Fatalf("rollback must keep the committed sidecar and drop the staged one: %q", d.Bytes)
	}

	m = dequeue("r2", "t2")
	h.one(update(m.State, `{"step":2}`))
	if r := h.one(release(m.State, false)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if st := h.stats("q"); st.Ready+st.InFlight+st.Delayed != 0 {
		t.Fatalf("commit must acknowledge the message: %+v", st)
	}
	if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
		t.Fatalf("commit must delete the sidecar: %q", d.Bytes)
	}
	if n := keyCount(h, bucketKeys); n != 1 {
		// The sidecar's record stays (its fencing counter), nothing else.
		t.Fatalf("%d key records", n)
	}
}

// Enlisted in a transaction, a dequeued message is acknowledged by commit
// and returned by rollback; an enqueued one appears on commit and vanishes
// on rollback.
func TestQueueMessagesInTransactions(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	c := deq("q", "r1", 0)
	c.Dequeue.TxnID = "t1"
	m := mustDeliver(t, h.one(c))
	l := mustLease(t, h.one(acq("k", "t1", "r2", 60_000, 0)))
	h.one(update(l, `{"done":"m1"}`))
	out := &Command{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: "out", ID: "o1", Visibility: 10_000,
		MaxAttempts: 2, TxnID: "t1", Payload: []byte("next")}}
	h.one(out)
	if st := h.stats("out"); st.Ready != 0 || st.Staged != 1 {
		t.Fatalf("an enqueue in a transaction is invisible until commit: %+v", st)
	}
	// Committing (here by releasing the key) acknowledges the delivery and
	// publishes the enqueue with the document.
	h.one(release(l, false))
	if st := h.stats("q"); st.Ready+st.InFlight != 0 {
		t.Fatalf("the delivery must be acknowledged: %+v", st)
	}
	if st := h.stats("out"); st.Ready != 1 {
		t.Fatalf("the enqueue must be visible: %+v", st)
	}
	if d := h.publicDoc("k"); string(d.Bytes) != `{"done":"m1"}` {
		t.Fatalf("k: %q", d.Bytes)
	}
	// The delivery ended acknowledged: its ack (a retry, or the consumer's
	// own after the commit) is answered so.
	if r := h.one(ackCmd(ref(m))); r.Err != nil {
		t.Fatalf("ack of a committed delivery: %+v", r)
	}

	// Rollback: the delivery goes back, the enqueue vanishes.
	h.one(enq("q", "m2", "y"))
	c = deq("q", "r3", 0)
	c.Dequeue.TxnID = "t2"
	m2 := mustDeliver(t, h.one(c))
	out.Enqueue.ID, out.Enqueue.TxnID = "o2", "t2"
	h.one(out)
	if r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m2)}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if tr := txnOf(h, "t2"); tr.State != TxnRollback {
		t.Fatalf("a nack of an enlisted delivery rolls its transaction back: %+v", tr)
	}
	if r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m2)}}); r.Err != nil || !r.Queue.Requeued {
		t.Fatalf("a retried nack of an enlisted delivery: %+v", r)
	}
	if st := h.stats("q"); st.Ready != 1 || st.Head.ID != "m2" || st.Head.Failures != 1 {
		t.Fatalf("m2 must be ready again: %+v", st)
	}
	if st := h.stats("out"); st.Ready != 1 || st.Staged != 0 {
		t.Fatalf("the rolled back enqueue must vanish: %+v", st)
	}
	// A delivery whose lease runs out rolls its transaction back.
	c = deq("q", "r4", 0)
	c.Dequeue.TxnID, c.Dequeue.Visibility = "t3", 1_000
	mustDeliver(t, h.one(c))
	h.now += 1_000
	h.one(sweep())
	if tr := txnOf(h, "t3"); tr.State != TxnRollback || tr.Reason != ReasonExpired {
		t.Fatalf("t3: %+v", tr)
	}
	if st := h.stats("q"); st.DeadReady != 1 {
		t.Fatalf("m2 failed twice, its last allowed time: %+v", st)
	}
	// A delivered message conflicts with another transaction that names it.
	h.one(enq("q", "m3", "z"))
	m3 := mustDeliver(t, h.one(deq("q", "r5", 0)))
	var holder string
	var conflict bool
	_ = h.f.View(func(v *View) error {
		r := queueResource{s: &applyState{reader: v.reader}, ns: "default", queue: "q", id: m3.ID, k: msgKey("default", "q", m3.ID)}
		holder, conflict = r.holder("t9", "")
		return nil
	})
	if !conflict || holder != "o-r5" {
		t.Fatalf("conflict: %v %q", conflict, holder)
	}
}

// A delivery whose lease runs out goes to the next waiting consumer in the
// sweep that ends it.
func TestExpiredDeliveryGoesToTheNextWaitingConsumer(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	c := deq("q", "a", 0)
	c.Dequeue.Visibility = 1_000
	first := mustDeliver(t, h.one(c))
	h.one(deq("q", "b", 60_000))
	h.now += 1_000
	h.rec.events = nil
	h.one(sweep())
	e := events(h, EventDelivered)["b"]
	if e == nil || e.Message.ID != "m1" || e.Message.Lease.Token != first.Lease.Token+1 || e.Message.Failures != 1 {
		t.Fatalf("the waiting consumer must get m1 with a new token: %+v", e)
	}
	wantCode(t, h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(first)}}), errcode.QueueLeaseMismatch)
}

// A message's TTL holds across a delivery that is handed back.
func TestTTLOutlivesADelivery(t *testing.T) {
	h := openHarness(t, t.TempDir())
	c := enq("q", "m1", "b")
	c.Enqueue.TTL = 5_000
	h.one(c)
	m := mustDeliver(t, h.one(deq("q", "r1", 0)))
	h.now += 6_000
	h.one(sweep())
	h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
	h.one(sweep())
	if st := h.stats("q"); st.Ready+st.InFlight+st.Delayed != 0 {
		t.Fatalf("the message outlived its TTL: %+v", st)
	}
}

// A message dead-lettered twice under one id replaces the first copy.
func TestDeadLetterOfAReusedID(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for round := 0; round < 2; round++ {
		c := enq("q", "X", fmt.Sprintf("b%d", round))
		c.Enqueue.MaxAttempts = 1
		h.one(c)
		m := mustDeliver(t, h.one(deq("q", fmt.Sprintf("r%d", round), 0)))
		if r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}}); r.Err != nil || r.Queue.DeadLetter == "" {
			t.Fatalf("%+v", r)
		}
	}
	mustDeliver(t, h.one(deq("q.dlq", "d1", 0)))
	wantCode(t, h.one(deq("q.dlq", "d2", 0)), errcode.QueueEmpty)
}

// A stateful delivery never takes a sidecar someone else holds.
func TestStatefulDeliveryLeavesAHeldSidecarAlone(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "b"))
	held := mustLease(t, h.one(acq(StateKey("q", "m1"), "tout", "o1", 60_000, 0)))
	c := statefulDeq("q", "r1", "sl", "st")
	wantCode(t, h.one(c), errcode.Waiting)
	var rec KeyRecord
	_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", StateKey("q", "m1")); return nil })
	if rec.Lease == nil || rec.Lease.ID != held.LeaseID {
		t.Fatalf("the sidecar changed hands: %+v", rec.Lease)
	}
	// A plain dequeue still gets the message; its ack leaves the sidecar.
	m := mustDeliver(t, h.one(deq("q", "r2", 0)))
	h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(m)}})
	_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", StateKey("q", "m1")); return nil })
	if rec.Lease == nil || rec.Lease.ID != held.LeaseID {
		t.Fatalf("an ack touched a sidecar it did not hold: %+v", rec.Lease)
	}
}

func statefulDeq(queue, req, lease, txn string) *Command {
	c := deq(queue, req, 0)
	c.Dequeue.WithState, c.Dequeue.StateLease, c.Dequeue.StateTxn = true, lease, txn
	return c
}

// A sidecar lease that ran out and was not swept yet still stands in a
// stateful delivery's way while its transaction is undecided: ending it
// there would drop the transaction's write to the sidecar and let the rest
// of the transaction commit. The sweep rolls the transaction back as a
// whole; the delivery then gets the sidecar.
func TestStatefulDeliveryWaitsForAnExpiredSidecarHoldersDecision(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	ls := mustLease(t, h.one(acq(StateKey("q", "m1"), "tx", "a1", 1_000, 0)))
	l2 := mustLease(t, h.one(acq("k2", "tx", "a2", 60_000, 0)))
	h.one(update(ls, `{"s":1}`))
	h.one(update(l2, `{"k2":1}`))
	h.now += 1_500 // ls ran out; no sweep yet
	wantCode(t, h.one(statefulDeq("q", "r1", "sl-1", "st-1")), errcode.Waiting)
	wantCode(t, h.one(release(l2, false)), errcode.TxnRolledBack)
	h.one(sweep())
	if tr := txnOf(h, "tx"); tr == nil || tr.State != TxnRollback {
		t.Fatalf("tx: %+v", tr)
	}
	if d := h.publicDoc("k2"); d.Exists {
		t.Fatalf("part of a transaction with an expired lease committed: %q", d.Bytes)
	}
	m := mustDeliver(t, h.one(statefulDeq("q", "r2", "sl-2", "st-2")))
	if m.State == nil || m.State.LeaseID != "sl-2" {
		t.Fatalf("the delivery did not get the freed sidecar: %+v", m.State)
	}
	if n := stagedCount(h); n != 0 {
		t.Fatalf("%d staged writes left", n)
	}
}

// The same when the holder's transaction also staged an enqueue: the sweep
// rolls it back with the rest, so nothing of it stays pending.
func TestSweptSidecarHolderIsRolledBackWhole(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	mustLease(t, h.one(acq(StateKey("q", "m1"), "tx", "a1", 2_000, 0)))
	if r := h.one(&Command{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: "out", ID: "o1",
		Visibility: 10_000, MaxAttempts: 2, TxnID: "tx", TxnTTL: 500, Payload: []byte("p")}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.now += 2_500
	wantCode(t, h.one(statefulDeq("q", "r1", "sl-1", "st-1")), errcode.Waiting)
	h.one(sweep())
	if tr := txnOf(h, "tx"); tr == nil || tr.State != TxnRollback {
		t.Fatalf("tx: %+v", tr)
	}
	if st := h.stats("out"); st.Staged+st.Ready != 0 {
		t.Fatalf("the rolled-back enqueue is still there: %+v", st)
	}
	m := mustDeliver(t, h.one(statefulDeq("q", "r2", "sl-2", "st-2")))
	h.one(ackCmd(ref(m)))
	if n := stagedCount(h); n != 0 {
		t.Fatalf("%d staged writes left", n)
	}
}

// A sidecar locked by a transaction prepared for another island's
// coordinator stays locked past its expiry until the coordinator decides,
// also against a stateful delivery, and the coordinator's commit writes it.
func TestStatefulDeliveryLeavesAPreparedSidecarAlone(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	h.one(enq("q", "m1", "x"))
	sk := StateKey("q", "m1")
	ls := mustLease(t, h.one(acq(sk, "tx", "a1", 5_000, 0)))
	h.one(update(ls, `{"prepared":true}`))
	if r := h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "tx", Home: "far", Term: 1,
		ExpiresAt: h.now + 10_000, LeaseID: "lx", Participants: []Participant{local(sk)}}}); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("prepare: %+v", r)
	}
	h.now += 11_000
	h.one(sweep()) // in doubt: the lock stays
	wantCode(t, h.one(statefulDeq("q", "r1", "sl-1", "st-1")), errcode.Waiting)
	if r := h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "tx", State: TxnCommit, Home: "far", Term: 1,
		Participants: []Participant{local(sk)}}}); r.Err != nil {
		t.Fatalf("commit: %+v", r)
	}
	if d := h.publicDoc(sk); string(d.Bytes) != `{"prepared":true}` {
		t.Fatalf("the prepared and committed write is lost: %q", d.Bytes)
	}
	mustDeliver(t, h.one(statefulDeq("q", "r2", "sl-2", "st-2")))
}

// When a stateful delivery's lease runs out while its sidecar's lease was
// kept alive longer, what the consumer staged in the sidecar is dropped, as
// on any expiry; only a nack keeps it.
func TestExpiredStatefulDeliveryDropsWhatItStaged(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	c := statefulDeq("q", "r1", "sl-1", "st-1")
	c.Dequeue.Visibility = 10_000
	m := mustDeliver(t, h.one(c))
	h.now += 5_000
	if r := h.one(&Command{Op: OpKeepAlive, KeepAlive: &KeepAliveCmd{Namespace: "default", Key: m.State.Key,
		LeaseID: m.State.LeaseID, TxnID: m.State.TxnID}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.one(update(m.State, `{"stale":true}`))
	h.now += 5_000 // the delivery's lease ran out, the sidecar's has 5 s left
	h.one(sweep())
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("the expired delivery is not back: %+v", st)
	}
	if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
		t.Fatalf("an expired delivery committed what it staged in the sidecar: %q", d.Bytes)
	}
	if tr := txnOf(h, "st-1"); tr == nil || tr.State != TxnRollback {
		t.Fatalf("the sidecar's transaction: %+v", tr)
	}
	mustDeliver(t, h.one(statefulDeq("q", "r2", "sl-2", "st-2")))
}

// A message whose time to live passed while it was delivered is dropped
// when the delivery ends, not handed to the next consumer; the nack says it
// was not requeued, and so does its retry.
func TestMessagePastItsTTLIsNotDeliveredAgain(t *testing.T) {
	for _, txn := range []string{"", "tx"} {
		t.Run("txn="+txn, func(t *testing.T) {
			h := openHarness(t, t.TempDir())
			c := enq("q", "m1", "b")
			c.Enqueue.TTL = 5_000
			h.one(c)
			d := deq("q", "r1", 0)
			d.Dequeue.TxnID = txn
			m := mustDeliver(t, h.one(d))
			h.now += 6_000
			h.one(sweep())
			h.one(deq("q", "w1", 30_000)) // a consumer waits
			h.rec.events = nil
			nack := &Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}}
			for i := range 2 {
				r := h.one(nack)
				if r.Err != nil || r.Queue.Requeued || r.Queue.DeadLetter != "" {
					t.Fatalf("nack %d: %+v %v", i, r.Queue, r.Err)
				}
			}
			if e := events(h, EventDelivered)["w1"]; e != nil {
				t.Fatalf("a message past its TTL was delivered: %+v", e.Message)
			}
			if st := h.stats("q"); st.Ready+st.InFlight+st.Delayed != 0 {
				t.Fatalf("the message outlived its TTL: %+v", st)
			}
		})
	}
}

// preparedSidecar is a plain stateful delivery on island "here" whose
// sidecar's transaction tx staged a write there and was then prepared for
// the coordinator of island "far".
func preparedSidecar(t *testing.T) (*harness, *MessageInfo) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	h.one(enq("q", "m1", "x"))
	c := statefulDeq("q", "r1", "sl-1", "tx")
	c.Dequeue.Visibility = 5_000
	m := mustDeliver(t, h.one(c))
	h.one(update(m.State, `{"s":1}`))
	if r := h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "tx", Home: "far", Term: 1,
		ExpiresAt: h.now + 60_000, LeaseID: "lx", Participants: []Participant{local(StateKey("q", "m1"))}}}); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("prepare: %+v", r)
	}
	return h, m
}

// The coordinator's decision of tx is carried out on the sidecar: its write
// is public after a commit, gone after a rollback.
func coordinatorDecides(t *testing.T, h *harness, state string) {
	t.Helper()
	if r := h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "tx", State: state, Home: "far", Term: 1,
		Participants: []Participant{local(StateKey("q", "m1"))}}}); r.Err != nil {
		t.Fatalf("the coordinator's %s is refused: %v", state, r.Err)
	}
	if d := h.publicDoc(StateKey("q", "m1")); d.Exists != (state == TxnCommit) {
		t.Fatalf("after the coordinator's %s the sidecar holds %q", state, d.Bytes)
	}
}

// A sidecar whose transaction another island's coordinator decides is left
// to that coordinator by everything a delivery does: an ack or a nack is
// refused (409 txn_pending) and the delivery's lease running out requeues
// the message without deciding the transaction.
func TestDeliveryLeavesACoordinatedSidecarToItsCoordinator(t *testing.T) {
	for _, end := range []string{"ack", "nack", "expiry"} {
		for _, decision := range []string{TxnCommit, TxnRollback} {
			t.Run(end+"/"+decision, func(t *testing.T) {
				h, m := preparedSidecar(t)
				switch end {
				case "ack":
					wantCode(t, h.one(ackCmd(ref(m))), errcode.TxnPending)
				case "nack":
					wantCode(t, h.one(nackCmd(ref(m))), errcode.TxnPending)
				case "expiry":
					h.now += 6_000 // the delivery's lease ran out, the prepare has 54 s left
					h.one(sweep())
					if st := h.stats("q"); st.Ready != 1 {
						t.Fatalf("the expired delivery is not back: %+v", st)
					}
				}
				if tr := txnOf(h, "tx"); tr.State != TxnPending {
					t.Fatalf("the prepared transaction was decided here: %s (%s)", tr.State, tr.Reason)
				}
				coordinatorDecides(t, h, decision)
			})
		}
	}
}

// On the home island, a nack of a stateful delivery whose sidecar's
// transaction spans islands does not commit it behind its coordinator.
func TestHomeNackLeavesACrossIslandSidecarTransactionPending(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	h.one(enq("q", "m1", "x"))
	m := mustDeliver(t, h.one(statefulDeq("q", "r1", "sl-1", "tx")))
	h.one(update(m.State, `{"s":1}`))
	c := decideCmd("tx", TxnPending, local(StateKey("q", "m1")), remote("b"))
	c.Decide.ExpiresAt = h.now + 60_000
	if r := h.one(c); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("pending: %+v", r)
	}
	wantCode(t, h.one(nackCmd(ref(m))), errcode.TxnPending)
	if tr := txnOf(h, "tx"); tr.State != TxnPending {
		t.Fatalf("decided without island b's prepare: %s (%s)", tr.State, tr.Reason)
	}
}

// A cancel that loses the race against a delivery answers the delivery.
func TestCancelAfterDeliveryAnswersIt(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(deq("q", "w1", 5_000))
	h.one(enq("q", "m1", "x"))
	r := h.one(&Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "w1"}})
	if r.Queue == nil || r.Queue.Message == nil || r.Queue.Message.ID != "m1" || string(r.Queue.Message.Payload) != "x" {
		t.Fatalf("cancel after delivery: %+v", r)
	}
}

// A cancel walks the queue for a delivery to its request only through the
// records that name the request: in a queue of many messages in flight, the
// cancel of a dequeue the queue never had waiting (its proposal failed, or
// the sweep ended it first) decodes none of them, instead of holding up
// every node's log while it decodes them all.
func TestCancelDecodesOnlyTheMessageDeliveredToIt(t *testing.T) {
	h := openHarness(t, t.TempDir())
	const n = 2_000
	var cmds []*Command
	for i := range n {
		cmds = append(cmds, enq("q", fmt.Sprintf("m%05d", i), "x"), deq("q", fmt.Sprintf("r%05d", i), 0))
	}
	for _, r := range h.run(cmds...) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// A request id JSON escapes is found all the same.
	h.one(deq("q", "w<&>", 5_000))
	h.one(enq("q", "last", "y"))
	r := h.one(&Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "w<&>"}})
	if r.Queue == nil || r.Queue.Message == nil || r.Queue.Message.ID != "last" {
		t.Fatalf("cancel after delivery: %+v", r)
	}
	allocs := testing.AllocsPerRun(3, func() {
		if r := h.one(&Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "gone"}}); r.Err != nil || r.Queue != nil && r.Queue.Message != nil {
			t.Fatalf("cancel of an unknown dequeue: %+v", r)
		}
	})
	if allocs > n/2 {
		t.Fatalf("a cancel allocated %.0f times in a queue of %d messages in flight: it decodes them", allocs, n)
	}
}

func ackCmd(r MessageRef) *Command { return &Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: r}} }
func nackCmd(r MessageRef) *Command {
	return &Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: r}}
}

func TestRetriedAckAndNackAreAnsweredAsTheFirst(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for _, id := range []string{"m1", "m2"} {
		h.one(enq("q", id, id))
	}
	m1 := mustDeliver(t, h.one(deq("q", "r1", 0)))
	m2 := mustDeliver(t, h.one(deq("q", "r2", 0)))

	// An ack retried after a lost answer succeeds and changes nothing.
	if r := h.one(ackCmd(ref(m1))); r.Err != nil {
		t.Fatal(r.Err)
	}
	before := h.hashWithoutMeta()
	if r := h.one(ackCmd(ref(m1))); r.Err != nil || !r.Released {
		t.Fatalf("retried ack: %+v", r)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a retried ack changed the state")
	}
	// It is not a nack, nor an ack with another token.
	wantCode(t, h.one(nackCmd(ref(m1))), errcode.QueueMessageNotFound)
	bad := ref(m1)
	bad.Token++
	wantCode(t, h.one(ackCmd(bad)), errcode.QueueMessageNotFound)

	// A retried nack gets the first answer, even once the message was
	// delivered again; the delivery it ended cannot be acknowledged.
	if r := h.one(nackCmd(ref(m2))); r.Err != nil || !r.Queue.Requeued {
		t.Fatalf("nack: %+v", r)
	}
	m2b := mustDeliver(t, h.one(deq("q", "r3", 0)))
	before = h.hashWithoutMeta()
	if r := h.one(nackCmd(ref(m2))); r.Err != nil || !r.Queue.Requeued || r.Queue.DeadLetter != "" {
		t.Fatalf("retried nack: %+v", r)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a retried nack changed the state")
	}
	wantCode(t, h.one(ackCmd(ref(m2))), errcode.QueueLeaseMismatch)
	// The second failure is the last allowed (max attempts 2): a retried
	// nack names the dead-letter queue too.
	if r := h.one(nackCmd(ref(m2b))); r.Err != nil || r.Queue.DeadLetter != "q.dlq" {
		t.Fatalf("nack to the dead letters: %+v", r)
	}
	if r := h.one(nackCmd(ref(m2b))); r.Err != nil || r.Queue.DeadLetter != "q.dlq" || r.Queue.Requeued {
		t.Fatalf("retried nack to the dead letters: %+v", r)
	}

	// The records last the decision retention (sweep(): 60 s), then the
	// retry is a stale delivery again.
	h.now += 30_000
	h.one(sweep())
	if r := h.one(ackCmd(ref(m1))); r.Err != nil {
		t.Fatalf("ack retried within the retention: %+v", r)
	}
	if next := nextDeadline(h, 60_000); next > h.now+30_000 {
		t.Fatalf("the sweeper is not woken for the records: next %d, now %d", next, h.now)
	}
	h.now += 30_001
	h.one(sweep())
	wantCode(t, h.one(ackCmd(ref(m1))), errcode.QueueMessageNotFound)
	wantCode(t, h.one(nackCmd(ref(m2))), errcode.QueueMessageNotFound) // it is in q.dlq now
	var left int
	_ = h.f.View(func(v *View) error {
		left = v.b(bucketQEnded).Stats().KeyN + v.b(bucketQEndedAt).Stats().KeyN
		return nil
	})
	if left != 0 {
		t.Fatalf("%d delivery records outlived the retention", left)
	}
}

// keyCount counts the keys of buckets.
func keyCount(h *harness, buckets ...[]byte) int {
	n := 0
	_ = h.f.View(func(v *View) error {
		for _, b := range buckets {
			n += v.b(b).Stats().KeyN
		}
		return nil
	})
	return n
}

func stagedCount(h *harness) int {
	var n int
	_ = h.f.View(func(v *View) error { n = v.StagedWrites(); return nil })
	return n
}

// A nack of an enlisted delivery whose message's time to live had passed
// says it was dropped, even when an earlier message of the same id lies in
// the dead-letter queue.
func TestEnlistedNackOfAMessagePastItsTTLSaysDropped(t *testing.T) {
	h := openHarness(t, t.TempDir())
	first := enq("q", "m1", "a")
	first.Enqueue.MaxAttempts = 1
	h.one(first)
	if r := h.one(nackCmd(ref(mustDeliver(t, h.one(deq("q", "r0", 0)))))); r.Err != nil || r.Queue.DeadLetter == "" {
		t.Fatalf("the first m1 is not dead-lettered: %+v", r)
	}
	again := enq("q", "m1", "b")
	again.Enqueue.TTL = 5_000
	h.one(again)
	d := deq("q", "r1", 0)
	d.Dequeue.TxnID = "tx"
	m := mustDeliver(t, h.one(d))
	h.now += 6_000
	r := h.one(nackCmd(ref(m)))
	if r.Err != nil || r.Queue.Requeued || r.Queue.DeadLetter != "" {
		t.Fatalf("nack of a message past its TTL answered %+v %v", r.Queue, r.Err)
	}
}

// An idempotent enqueue retried after its message was consumed is answered
// as the first attempt was, for the decision retention, instead of
// enqueuing the message again; one whose transaction rolled back says so.
func TestRetriedIdempotentEnqueueIsOnceAfterTheMessageIsGone(t *testing.T) {
	h := openHarness(t, t.TempDir())
	idem := func(queue, id string, attempts int, txn string) *Command {
		return &Command{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: queue, ID: id, Visibility: 10_000,
			MaxAttempts: attempts, TxnID: txn, Idempotent: true, Payload: []byte(id)}}
	}
	first := h.one(idem("q", "m-acked", 2, ""))
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	if next := nextDeadline(h, 60_000); next != h.now+60_000 {
		t.Fatalf("the sweeper is not woken for the record: next %d, now %d", next, h.now)
	}
	h.one(ackCmd(ref(mustDeliver(t, h.one(deq("q", "r1", 0))))))
	h.one(idem("q", "m-dead", 1, ""))
	if r := h.one(nackCmd(ref(mustDeliver(t, h.one(deq("q", "r2", 0)))))); r.Err != nil || r.Queue.DeadLetter != "q.dlq" {
		t.Fatalf("nack past max attempts: %+v", r)
	}
	h.one(idem("q", "m-rolled", 2, "t1"))
	h.one(decideCmd("t1", TxnRollback))

	before := h.hashWithoutMeta()
	if r := h.one(idem("q", "m-acked", 2, "")); r.Err != nil || r.Queue.Message.ID != "m-acked" ||
		r.Queue.Message.EnqueuedAt != first.Queue.Message.EnqueuedAt {
		t.Fatalf("retry after the ack: %+v, want the first answer %+v", r.Queue, first.Queue.Message)
	}
	if r := h.one(idem("q", "m-dead", 1, "")); r.Err != nil || r.Queue.Message.ID != "m-dead" {
		t.Fatalf("retry after the dead letter: %+v", r)
	}
	wantCode(t, h.one(idem("q", "m-rolled", 2, "t1")), errcode.TxnRolledBack)
	wantCode(t, h.one(idem("q", "m-rolled", 2, "")), errcode.TxnRolledBack)
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a retried enqueue changed the state")
	}
	if st := h.stats("q"); st.Ready+st.InFlight+st.Staged != 0 {
		t.Fatalf("q after the retries: %+v", st)
	}
	// Without the flag, the same id is another message.
	again := idem("q", "m-acked", 2, "")
	again.Enqueue.Idempotent = false
	h.one(again)
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("a plain enqueue of a used id: %+v", st)
	}
	h.one(ackCmd(ref(mustDeliver(t, h.one(deq("q", "r3", 0))))))

	// After the retention the key is forgotten.
	h.now += 60_001
	h.one(sweep())
	if n := keyCount(h, bucketQIdem, bucketQIdemAt); n != 0 {
		t.Fatalf("%d enqueue records outlived the retention", n)
	}
	h.one(idem("q", "m-acked", 2, ""))
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("an enqueue after the retention: %+v", st)
	}
}

// nextDeadline is when the sweeper is next due, with the given retention.
func nextDeadline(h *harness, retention int64) int64 {
	var next int64
	_ = h.f.View(func(v *View) error { next, _ = v.NextDeadline(retention); return nil })
	return next
}

// A nack of a delivery whose lease ran out is refused, as an ack is: the
// expiry ended it, not its consumer, and the nack's delay and error would
// not be applied. Only a retry of a nack that ended it is answered so.
func TestANackAfterTheLeaseRanOutIsRefused(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	m := mustDeliver(t, h.one(deq("q", "r1", 0)))
	h.now += 10_001 // past the 10 s visibility
	h.one(sweep())
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("the expired delivery is not back: %+v", st)
	}
	wantCode(t, h.one(nackCmd(ref(m))), errcode.QueueLeaseMismatch)
	wantCode(t, h.one(ackCmd(ref(m))), errcode.QueueLeaseMismatch)
}

// A message's state sidecar lives as long as the message: moved to the
// dead-letter queue with it (where a stateful delivery of the dead letter
// finds what the failed consumers committed), deleted when its time to
// live drops it.
func TestTheSidecarGoesWhereTheMessageGoes(t *testing.T) {
	// dies fails the delivery of m for the last time.
	for name, dies := range map[string]func(h *harness, m *MessageInfo){
		"nack": func(h *harness, m *MessageInfo) {
			h.one(update(m.State, `{"step":1}`))
			if r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}}); r.Err != nil || r.Queue.DeadLetter != "q.dlq" {
				t.Fatalf("nack: %+v", r)
			}
		},
		"expiry": func(h *harness, m *MessageInfo) {
			h.now += 10_000
			h.one(sweep())
		},
		"rollback of its transaction": func(h *harness, m *MessageInfo) {
			h.one(update(m.State, `{"step":1}`))
			if r := h.one(release(m.State, true)); r.Err != nil {
				t.Fatal(r.Err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := sidecarHarness(t, func(c *EnqueueCmd) { c.MaxAttempts = 1 })
			c := statefulDeq("q", "r1", "sl-1", "st-1")
			if name == "rollback of its transaction" {
				c.Dequeue.TxnID, c.Dequeue.StateTxn = "t1", ""
			}
			dies(h, mustDeliver(t, h.one(c)))
			if st := h.stats("q"); st.DeadReady != 1 {
				t.Fatalf("the message did not die: %+v", st)
			}
			want := `{"step":1}`
			if name != "nack" {
				want = `{"step":0}` // what the failed delivery staged is dropped
			}
			if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
				t.Fatalf("the sidecar stayed behind in q: %q", d.Bytes)
			}
			if d := h.publicDoc(StateKey("q.dlq", "m1")); string(d.Bytes) != want {
				t.Fatalf("the dead letter's sidecar: %q, want %s", d.Bytes, want)
			}
			dead := mustDeliver(t, h.one(statefulDeq("q.dlq", "d1", "sl-d1", "st-d1")))
			if string(dead.StateDoc) != want {
				t.Fatalf("a stateful delivery of the dead letter got %q, want %s", dead.StateDoc, want)
			}
			h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(dead)}})
			if d := h.publicDoc(StateKey("q.dlq", "m1")); d.Exists {
				t.Fatalf("the ack of the dead letter left its sidecar: %q", d.Bytes)
			}
			if n := stagedCount(h); n != 0 {
				t.Fatalf("%d staged writes left", n)
			}
		})
	}

	t.Run("a newer dead letter of the same id", func(t *testing.T) {
		h := openHarness(t, t.TempDir())
		h.one(adoptRules())
		for i, doc := range []string{`{"round":0}`, ""} {
			c := enq("q", "X", "b")
			c.Enqueue.MaxAttempts = 1
			h.one(c)
			m := mustDeliver(t, h.one(statefulDeq("q", fmt.Sprintf("r%d", i), fmt.Sprintf("sl-%d", i), fmt.Sprintf("st-%d", i))))
			if doc != "" {
				h.one(update(m.State, doc))
			}
			h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}})
		}
		if d := h.publicDoc(StateKey("q.dlq", "X")); d.Exists {
			t.Fatalf("the sidecar of the replaced dead letter outlived it: %q", d.Bytes)
		}
	})

	t.Run("time to live", func(t *testing.T) {
		h := sidecarHarness(t, func(c *EnqueueCmd) { c.TTL = 20_000 })
		h.now += 20_000
		h.one(sweep())
		if st := h.stats("q"); st.Ready != 0 {
			t.Fatalf("the message outlived its time to live: %+v", st)
		}
		if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
			t.Fatalf("the sidecar outlived its message: %q", d.Bytes)
		}
	})

	t.Run("time to live during a delivery", func(t *testing.T) {
		h := openHarness(t, t.TempDir())
		h.one(adoptRules())
		c := enq("q", "m1", "x")
		c.Enqueue.TTL = 5_000
		h.one(c)
		m := mustDeliver(t, h.one(statefulDeq("q", "r0", "sl-0", "st-0")))
		h.one(update(m.State, `{"step":0}`))
		h.now += 5_000
		if r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}}); r.Err != nil || r.Queue.Requeued {
			t.Fatalf("nack past the time to live: %+v", r)
		}
		if d := h.publicDoc(StateKey("q", "m1")); d.Exists {
			t.Fatalf("the sidecar outlived its message: %q", d.Bytes)
		}
		if n := stagedCount(h); n != 0 {
			t.Fatalf("%d staged writes left", n)
		}
	})

	t.Run("held by another", func(t *testing.T) {
		// A sidecar someone else holds is theirs: it stays where it is.
		h := sidecarHarness(t, func(c *EnqueueCmd) { c.MaxAttempts = 1 })
		held := mustLease(t, h.one(acq(StateKey("q", "m1"), "tout", "o1", 60_000, 0)))
		m := mustDeliver(t, h.one(deq("q", "r1", 0)))
		h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}})
		if d := h.publicDoc(StateKey("q", "m1")); string(d.Bytes) != `{"step":0}` {
			t.Fatalf("a held sidecar moved: %q", d.Bytes)
		}
		var rec KeyRecord
		_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", StateKey("q", "m1")); return nil })
		if rec.Lease == nil || rec.Lease.ID != held.LeaseID {
			t.Fatalf("the holder lost the sidecar: %+v", rec.Lease)
		}
	})
}

// sidecarHarness is a harness that follows this build's rules, where
// message m1 of queue q (enqueued as adjust says) has the committed sidecar
// {"step":0}, left by a first stateful delivery that deferred it.
func sidecarHarness(t *testing.T, adjust func(*EnqueueCmd)) *harness {
	h := openHarness(t, t.TempDir())
	h.one(adoptRules())
	c := enq("q", "m1", "x")
	adjust(c.Enqueue)
	h.one(c)
	m := mustDeliver(t, h.one(statefulDeq("q", "r0", "sl-0", "st-0")))
	h.one(update(m.State, `{"step":0}`))
	h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
	return h
}

// adoptRules is the sweep a leader proposes once every server applies this
// build's entry format.
func adoptRules() *Command {
	return &Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: EntryFormat}}
}

// Until the island follows format 6, a dead letter's sidecar stays where it
// was, as older builds leave it: every node applies the entry alike.
func TestTheSidecarStaysBeforeTheIslandFollowsFormat6(t *testing.T) {
	h := openHarness(t, t.TempDir())
	c := enq("q", "m1", "x")
	c.Enqueue.MaxAttempts = 1
	h.one(c)
	m := mustDeliver(t, h.one(statefulDeq("q", "r0", "sl-0", "st-0")))
	h.one(update(m.State, `{"step":0}`))
	h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}})
	if d := h.publicDoc(StateKey("q", "m1")); string(d.Bytes) != `{"step":0}` {
		t.Fatalf("the sidecar moved before the island follows format 6: %q", d.Bytes)
	}
	var rules int
	_ = h.f.View(func(v *View) error { rules = v.rules(); return nil })
	if rules != formatV1 || h.f.Rules() != formatV1 {
		t.Fatalf("rules %d before any sweep raised them", rules)
	}
	h.one(adoptRules())
	h.one(sweep()) // a sweep without a format never lowers them
	if got := h.f.Rules(); got != EntryFormat {
		t.Fatalf("rules %d after adopting %d", got, EntryFormat)
	}
}
