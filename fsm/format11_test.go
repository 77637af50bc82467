package fsm

import (
	"fmt"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// Entry format 11: a nack of a delivery whose transaction another island's
// coordinator decides is noted on the delivery, and the coordinator's
// rollback requeues the message as the nack asked (defer spends no
// attempt, the delay holds it back) and records the delivery as nacked, so
// that a retried nack is answered as the first. Until the island follows
// format 11, the rollback counts as a failed delivery (with max_attempts 1,
// a dead letter) and a retried nack is refused.
func TestACoordinatedNackIsRequeuedAsItAsks(t *testing.T) {
	for _, rules := range []int{formatV10, formatV11} {
		h := rulesHarness(t, rules)
		h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
		c := enq("q", "m1", "x")
		c.Enqueue.MaxAttempts = 1
		h.one(c)
		d := deq("q", "r1", 0)
		d.Dequeue.TxnID = "tx"
		m := mustDeliver(t, h.one(d))
		if r := h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "tx", Home: "far", Term: 1,
			ExpiresAt: h.now + 60_000, LeaseID: "lx", Participants: []Participant{local(MessageKey("q", "m1"))}}}); r.Err != nil || r.Decision != TxnPending {
			t.Fatalf("rules %d: prepare: %+v", rules, r)
		}
		nack := &Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true, Delay: 5_000}}
		wantCode(t, h.one(nack), errcode.TxnCoordinated)
		if r := h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "tx", State: TxnRollback, Home: "far", Term: 1,
			Participants: []Participant{local(MessageKey("q", "m1"))}}}); r.Err != nil {
			t.Fatalf("rules %d: the coordinator's rollback: %v", rules, r.Err)
		}
		st, dead := h.stats("q"), h.stats("q.dlq")
		if rules < formatV11 {
			if dead.Ready != 1 || st.Ready+st.Delayed != 0 {
				t.Fatalf("rules %d: the rollback did not count as the last failure: %+v, dead letters %+v", rules, st, dead)
			}
			wantCode(t, h.one(nack), errcode.QueueMessageNotFound) // it is a dead letter
			continue
		}
		if st.Delayed != 1 || dead.Ready != 0 {
			t.Fatalf("rules %d: the message is not held back as the deferring nack asked: %+v, dead letters %+v", rules, st, dead)
		}
		if r := h.one(nack); r.Err != nil || r.Queue == nil || !r.Queue.Requeued {
			t.Fatalf("rules %d: the retried nack: %+v", rules, r)
		}
		h.now += 5_000
		h.one(sweep())
		if m := mustDeliver(t, h.one(deq("q", "r2", 0))); m.Attempts != 2 || m.Failures != 0 {
			t.Fatalf("rules %d: the redelivery: %+v", rules, m)
		}
		checkInvariants(t, h)
	}
}

// Entry format 11: a withdrawn acquire whose request was granted a lease
// that has run out since is answered as withdrawn; before, it was handed
// the lease that had run out.
func TestAWithdrawnAcquireIsNotHandedALeaseThatRanOut(t *testing.T) {
	for _, rules := range []int{formatV10, formatV11} {
		h := rulesHarness(t, rules)
		held := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
		if r := h.one(acq("k", "t2", "r2", 1_000, 30_000)); !r.Queued {
			t.Fatalf("rules %d: the second acquire did not queue: %+v", rules, r)
		}
		h.one(release(held, false)) // grants r2 in this step
		h.now += 2_000
		r := h.one(&Command{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: "default", Key: "k", RequestID: "r2"}})
		if rules < formatV11 {
			if r.Lease == nil || r.Lease.ExpiresAt > h.now {
				t.Fatalf("rules %d: %+v, want the lease that ran out, as older builds answer", rules, r)
			}
			continue
		}
		if r.Lease != nil || !r.Cancelled {
			t.Fatalf("rules %d: the withdrawal was answered with %+v", rules, r)
		}
		h.one(sweep())
		mustLease(t, h.one(acq("k", "t3", "r3", 10_000, 0)))
		checkInvariants(t, h)
	}
}

// Entry format 11: a dead letter that takes the place of an earlier one
// with its id ends the earlier one's delivery when that one is in flight,
// so that its consumer (a subscription watching it) hears that it ended.
func TestADeadLetterReplacingOneInFlightEndsItsDelivery(t *testing.T) {
	for _, rules := range []int{formatV10, formatV11} {
		h := rulesHarness(t, rules)
		var held *MessageInfo
		for round := 0; round < 2; round++ {
			c := enq("q", "X", fmt.Sprintf("b%d", round))
			c.Enqueue.MaxAttempts = 1
			h.one(c)
			m := mustDeliver(t, h.one(deq("q", fmt.Sprintf("r%d", round), 0)))
			h.rec.events = nil
			h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m)}})
			if round == 0 {
				held = mustDeliver(t, h.one(deq("q.dlq", "d0", 0)))
			}
		}
		ended := false
		for _, e := range h.rec.events {
			ended = ended || e.Kind == EventDeliveryEnded && e.RequestID == held.Lease.ID
		}
		if ended != (rules >= formatV11) {
			t.Fatalf("rules %d: the replaced dead letter's delivery ended: %v (events %+v)", rules, ended, h.rec.events)
		}
		checkInvariants(t, h)
	}
}
