package testcluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// Consumers on every node dequeue at once: each message is delivered to
// exactly one of them, and all are delivered.
func TestConcurrentConsumersNeverShareADelivery(t *testing.T) {
	c := Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const messages, consumers = 60, 6
	for i := 0; i < messages; i++ {
		if _, err := c.RetryingClient(i%3).Enqueue(ctx, wire.EnqueueRequest{Queue: "jobs"}, []byte(fmt.Sprintf("j%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < consumers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cl := c.RetryingClient(w % 3)
			for ctx.Err() == nil {
				d, err := cl.Dequeue(ctx, wire.DequeueRequest{Queue: "jobs", Owner: fmt.Sprintf("c%d", w),
					WaitSeconds: wire.BlockNoWait, VisibilityTimeoutSeconds: 60})
				if err != nil || d == nil {
					return // empty
				}
				mu.Lock()
				seen[d.Message.MessageID]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(seen) != messages {
		t.Fatalf("%d of %d messages delivered", len(seen), messages)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("message %s delivered %d times while leased", id, n)
		}
	}
}

// A consumer waiting on one node gets a message enqueued through another
// as soon as it is committed (the leader hands it over in the enqueue's
// step and pushes the delivery to the waiting node).
func TestBlockedConsumerGetsAMessageEnqueuedOnAnotherNode(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rest := others(c, leader)
	ctx := context.Background()
	got := make(chan time.Time, 1)
	go func() {
		d, err := c.Client(rest[0]).Dequeue(ctx, wire.DequeueRequest{Queue: "idle", Owner: "w", WaitSeconds: 20})
		if err != nil || d == nil || string(d.Payload) != "wake" {
			t.Errorf("dequeue: %+v %v", d, err)
		}
		got <- time.Now()
	}()
	waitFor(t, 5*time.Second, "the consumer to wait", func() bool {
		st, err := c.Client(leader).QueueStats(ctx, "", "idle", false)
		return err == nil && st.WaitingConsumers == 1
	})
	pushed := counter(t, c, leader, "raftlockd_grants_pushed_total")
	start := time.Now()
	if _, err := c.Client(rest[1]).Enqueue(ctx, wire.EnqueueRequest{Queue: "idle"}, []byte("wake")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("delivered %s after the enqueue was sent", at.Sub(start))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting consumer was not served")
	}
	// The delivery was made in the enqueue's own step, and the leader sent
	// it to the server the consumer waits on as it applied that step.
	waitFor(t, 5*time.Second, "the leader to push the delivery", func() bool {
		return counter(t, c, leader, "raftlockd_grants_pushed_total") > pushed
	})
}

// A no-wait dequeue forwarded to the leader whose answer comes back after
// the request's deadline may have leased a message: the follower finds out
// (it withdraws the request, which answers the delivery it got) and hands
// the message back, without spending an attempt, instead of answering that
// the queue is empty and leaving the message leased to nobody until its
// visibility timeout.
func TestADequeueWhoseAnswerCameTooLateHandsItsMessageBack(t *testing.T) {
	c, leader, f, ctx := slowFollower(t, "late")
	stats := func() *wire.QueueStatsResponse {
		st, err := c.Client(leader).QueueStats(ctx, "", "late", false)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// The request reaches the leader within its deadline; the answer
	// comes back after it.
	c.Fabric.Delay(c.Nodes[leader].Name, c.Nodes[f].Name, 300*time.Millisecond)
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := c.Client(f).Dequeue(short, wire.DequeueRequest{Queue: "late", Owner: "o", WaitSeconds: wire.BlockNoWait,
		VisibilityTimeoutSeconds: 60})
	stop()
	t.Logf("the dequeue answered %v", err)
	testutil.WaitFor(t, 10*time.Second, "the late dequeue to lease the message", func() bool { return stats().InFlight == 1 })
	testutil.WaitFor(t, 10*time.Second, "the message to be ready again", func() bool { return stats().Ready == 1 })
	c.Fabric.Heal()
	d, err := c.RetryingClient(leader).Dequeue(ctx, wire.DequeueRequest{Queue: "late", Owner: "o2", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	if d.Message.FailureAttempts != 0 {
		t.Fatalf("the handed-back message counts %d failed deliveries, want 0", d.Message.FailureAttempts)
	}
}

// A write a follower is forwarding when it shuts down gets its answer: the
// follower lets requests in flight finish for a moment before it ends
// them, so a client that could not send the write again (no idempotency
// key) learns that it took effect instead of getting shutdown_draining.
func TestAWriteInFlightAtShutdownGetsItsAnswer(t *testing.T) {
	c, leader, f, ctx := slowFollower(t, "warm")
	producer := c.Client(f)
	c.Fabric.Delay(c.Nodes[leader].Name, c.Nodes[f].Name, 150*time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		_, err := producer.EnqueueWithKey(ctx, wire.EnqueueRequest{Queue: "inflight"}, []byte("m"), "")
		errc <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the leader to apply the enqueue", func() bool {
		st, err := c.Client(leader).QueueStats(ctx, "", "inflight", true)
		return err == nil && st.Ready == 1
	})
	c.Stop(f)
	if err := <-errc; err != nil {
		t.Fatalf("the enqueue in flight at shutdown answered %v, want its success", err)
	}
}

// slowFollower starts a cluster of three and enqueues a message to queue
// through a follower f, so that f's connection to the leader is open before
// a test delays it. ctx ends with the test.
func slowFollower(t *testing.T, queue string) (c *Cluster, leader, f int, ctx context.Context) {
	t.Helper()
	c = Start(t, 3)
	leader = c.WaitLeader(10 * time.Second)
	f = (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := c.RetryingClient(f).Enqueue(ctx, wire.EnqueueRequest{Queue: queue}, []byte("m")); err != nil {
		t.Fatal(err)
	}
	return c, leader, f, ctx
}
