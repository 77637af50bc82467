package fsm

import (
	"fmt"
	"testing"
)

// BenchmarkHandOffPastWaitsThatAreOver hands a key on (a release) and a
// message on (a nack) past 10,000 requests whose waits are over but not yet
// swept, to the request behind them: one op is both.
func BenchmarkHandOffPastWaitsThatAreOver(b *testing.B) {
	const waits, batch = 10_000, 1_000
	h := openHarness(b, b.TempDir())
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		key, queue := fmt.Sprintf("k%d", i), fmt.Sprintf("q%d", i)
		l := h.one(acq(key, fmt.Sprintf("t%d", i), fmt.Sprintf("first%d", i), 60_000, 0)).Lease
		h.one(enq(queue, "m", "x"))
		first := deq(queue, fmt.Sprintf("c%d", i), 0)
		first.Dequeue.Visibility = 60_000
		m := h.one(first).Queue.Message
		for j := 0; j < waits; j += batch {
			cmds := make([]*Command, 0, 2*batch)
			for n := j; n < j+batch; n++ {
				id := fmt.Sprintf("%d-%d", i, n)
				cmds = append(cmds, acq(key, "t"+id, "r"+id, 10_000, 10_000), deq(queue, "w"+id, 10_000))
			}
			h.run(cmds...)
		}
		h.run(acq(key, fmt.Sprintf("tl%d", i), fmt.Sprintf("last%d", i), 10_000, 60_000), deq(queue, fmt.Sprintf("lastq%d", i), 60_000))
		h.now += 10_000
		b.StartTimer()
		h.one(release(l, false))
		h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
	}
}
