package fsm

import (
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// drop_waits withdraws the requests waiting on one server in its earlier
// runs, key acquires and dequeues alike, and leaves the ones of its current
// run and of other servers queued, in their order.
func TestDropWaitsWithdrawsOnlyTheRequestsOfEarlierRuns(t *testing.T) {
	h := openHarness(t, t.TempDir())
	held := mustLease(t, h.one(acq("k", "t0", "r0", 60_000, 0)))
	waiter := func(req, node, run string) *Command {
		c := acq("k", "t-"+req, req, 60_000, 30_000)
		c.Acquire.Node, c.Acquire.Run = node, run
		return c
	}
	dequeuer := func(req, node, run string) *Command {
		c := deq("q", req, 30_000)
		c.Dequeue.Node, c.Dequeue.Run = node, run
		return c
	}
	for _, c := range []*Command{waiter("ghost", "n2", "old"), waiter("live", "n2", "new"), waiter("other", "n3", "old"),
		dequeuer("qghost", "n2", "old"), dequeuer("qlive", "n2", "new")} {
		if r := h.one(c); !r.Queued && (r.Queue == nil || !r.Queue.Queued) {
			t.Fatalf("%s: %+v", c.Op, r)
		}
	}
	drop := &Command{Op: OpDropWaits, DropWaits: &DropWaitsCmd{Node: "n2", Run: "new"}}
	h.rec.events = nil
	if r := h.one(drop); r.Err != nil || !r.Cancelled {
		t.Fatalf("drop_waits: %+v", r)
	}
	var ended []string
	for _, e := range h.rec.events {
		if e.Kind == EventWaitEnded {
			ended = append(ended, e.RequestID)
		}
	}
	if len(ended) != 2 || ended[0] != "ghost" || ended[1] != "qghost" {
		t.Fatalf("withdrawn: %v", ended)
	}
	if r := h.one(drop); r.Err != nil || r.Cancelled {
		t.Fatalf("drop_waits again: %+v", r)
	}
	// The key goes to the first request still waiting, the message too.
	h.one(release(held, false))
	var rec KeyRecord
	_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", "k"); return nil })
	if rec.Lease == nil || rec.Lease.RequestID != "live" || rec.Waiters != 1 {
		t.Fatalf("after the release: %+v", rec)
	}
	h.one(enq("q", "m1", "x"))
	if st := h.stats("q"); st.InFlight != 1 || st.Waiting != 0 {
		t.Fatalf("queue after an enqueue: %+v", st)
	}
	wantCode(t, h.one(&Command{Op: OpDropWaits, DropWaits: &DropWaitsCmd{Node: "n2"}}), errcode.MalformedCmd)
}
