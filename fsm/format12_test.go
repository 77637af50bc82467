package fsm

import (
	"fmt"
	"testing"
)

// Entry format 12: a sweep ends the waits that are over before it expires
// anything, one unit of its budget each, so that the lease or delivery it
// expires is handed on without walking past them. Before, a lease running
// out together with the waits of many acquirers of its key (or a delivery
// with the waits of many consumers of its queue) ended every one of them
// in one sweep entry, whatever its limit.
func TestASweepEndsWaitsThatAreOverWithinItsLimit(t *testing.T) {
	const waits, limit = 200, 16
	for _, queue := range []bool{false, true} {
		for _, rules := range []int{formatV11, formatV12} {
			h := rulesHarness(t, rules)
			var cmds []*Command
			if queue {
				h.one(enq("q", "m1", "x")) // a visibility of 10 s
				mustDeliver(t, h.one(deq("q", "first", 0)))
				for i := range waits {
					cmds = append(cmds, deq("q", fmt.Sprintf("r%03d", i), 10_000))
				}
				cmds = append(cmds, deq("q", "last", 60_000))
			} else {
				mustLease(t, h.one(acq("k", "t0", "first", 10_000, 0)))
				for i := range waits {
					cmds = append(cmds, acq("k", fmt.Sprintf("t%03d", i), fmt.Sprintf("r%03d", i), 10_000, 10_000))
				}
				cmds = append(cmds, acq("k", "tl", "last", 10_000, 60_000))
			}
			h.run(cmds...)
			h.now += 10_000
			h.rec.events = nil
			r := h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: limit, TxnRetention: 60_000}})
			ended := len(events(h, EventWaitEnded))
			if rules < formatV12 {
				if ended != waits || r.Sweep.More {
					t.Fatalf("queue %v, rules %d: %d waits ended by one sweep (more: %v), want all %d as older builds do", queue, rules, ended, r.Sweep.More, waits)
				}
				continue
			}
			if ended > limit || !r.Sweep.More {
				t.Fatalf("queue %v, rules %d: one sweep of limit %d ended %d waits (more: %v)", queue, rules, limit, ended, r.Sweep.More)
			}
			for sweeps := 1; r.Sweep.More; sweeps++ {
				if sweeps > waits {
					t.Fatalf("queue %v: the sweeps do not end", queue)
				}
				r = h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: limit, TxnRetention: 60_000}})
			}
			kind := EventGranted
			if queue {
				kind = EventDelivered
			}
			if got := events(h, kind); len(got) != 1 || got["last"] == nil || len(events(h, EventWaitEnded)) != waits {
				t.Fatalf("queue %v: handed to %v, %d waits ended; want the last request alone, and %d", queue, got, len(events(h, EventWaitEnded)), waits)
			}
			checkInvariants(t, h)
		}
	}
}
