package fsm

import (
	"fmt"
	"testing"
)

// BenchmarkQueueStats reads the stats of a queue of 100,000 messages: a
// tenth in flight, a tenth delayed, the rest ready.
func BenchmarkQueueStats(b *testing.B) {
	h := openHarness(b, b.TempDir())
	const n, batch = 100_000, 1_000
	for i := 0; i < n; i += batch {
		cmds := make([]*Command, 0, batch)
		for j := i; j < i+batch; j++ {
			c := enq("big", fmt.Sprintf("m%06d", j), "x")
			if j%10 == 1 {
				c.Enqueue.Delay = 3_600_000
			}
			cmds = append(cmds, c)
		}
		h.run(cmds...)
	}
	for i := 0; i < n/10; i += batch {
		cmds := make([]*Command, 0, batch)
		for j := i; j < i+batch; j++ {
			cmds = append(cmds, deq("big", fmt.Sprintf("r%06d", j), 0))
		}
		h.run(cmds...)
	}
	want := QueueStats{Ready: n - n/5, InFlight: n / 10, Delayed: n / 10}
	if st := h.stats("big"); st.Ready != want.Ready || st.InFlight != want.InFlight || st.Delayed != want.Delayed {
		b.Fatalf("stats %+v, want %+v", st, want)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.stats("big")
	}
}
