package testcluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A steady stream of enqueues and dequeues goes on while the leader
// crashes: every message enqueued is delivered, and a message is delivered
// again only if an earlier delivery was not acknowledged (at least once,
// never after its ack). Every message is acknowledged exactly once as far
// as the consumer can tell: an ack whose answer was lost in the crash is
// retried, and the retry of an ack that took effect succeeds too.
func TestLeaderCrashDuringAQueueStream(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rest := others(c, leader)
	producer, consumer := c.RetryingClient(rest[0]), c.RetryingClient(rest[1])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 120

	var mu sync.Mutex
	acked := map[string]int{}     // payload -> successful acks
	delivered := map[string]int{} // payload -> deliveries
	var violations []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			d, err := consumer.Dequeue(ctx, wire.DequeueRequest{Queue: "stream", Owner: "c", WaitSeconds: 1,
				VisibilityTimeoutSeconds: 2})
			if err != nil || d == nil {
				// Empty, or the cluster is between leaders.
				mu.Lock()
				all := len(delivered) == n
				mu.Unlock()
				if all && queueEmpty(ctx, consumer) {
					return
				}
				continue
			}
			p := string(d.Payload)
			mu.Lock()
			if acked[p] > 0 {
				violations = append(violations, fmt.Sprintf("%s delivered again after its ack", p))
			}
			delivered[p]++
			mu.Unlock()
			if err := d.Ack(ctx); err == nil {
				mu.Lock()
				acked[p]++
				mu.Unlock()
			}
		}
	}()

	for i := 0; i < n; i++ {
		if i == n/3 {
			c.Crash(leader)
		}
		if i == 2*n/3 {
			c.Start(leader)
		}
		payload := fmt.Sprintf("m%03d", i)
		// Retried with the same idempotency key until acknowledged.
		for {
			_, err := producer.EnqueueWithKey(ctx, wire.EnqueueRequest{Queue: "stream"}, []byte(payload), "key-"+payload)
			if err == nil {
				break
			}
			var e *errcode.Error
			if ctx.Err() != nil || (errors.As(err, &e) && e.Code == errcode.InvalidQueue.Code) {
				t.Fatalf("enqueue %s: %v", payload, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%v", violations)
	}
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("m%03d", i)
		if delivered[p] == 0 || acked[p] != 1 {
			t.Errorf("%s: acked %d times, delivered %d times", p, acked[p], delivered[p])
		}
	}
	if !queueEmpty(context.Background(), c.RetryingClient(rest[0])) {
		t.Fatal("the queue must be empty")
	}
	c.WaitConverged(15 * time.Second)
}

// queueEmpty reports whether the stream queue holds no message, visible or
// leased.
func queueEmpty(ctx context.Context, cl *client.Client) bool {
	st, err := cl.QueueStats(ctx, "", "stream", false)
	return err == nil && !st.Available && st.HeadMessageID == "" && st.Ready+st.InFlight+st.Delayed+st.Staged == 0
}

// A subscription whose node crashes under it goes on once the node is back:
// the client opens the stream again instead of ending with the cut one's
// error, and a message enqueued meanwhile reaches it.
func TestSubscriptionOutlivesACrashOfItsNode(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	producer := c.RetryingClient(others(c, leader)[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := make(chan string, 4)
	done := make(chan error, 1)
	go func() {
		done <- c.RetryingClient(leader).Subscribe(ctx, wire.DequeueRequest{Queue: "sub", Owner: "s", WaitSeconds: 2},
			func(d *client.Delivery) error {
				got <- string(d.Payload)
				return d.Ack(ctx)
			})
	}()
	receive := func(want string) {
		t.Helper()
		select {
		case p := <-got:
			if p != want {
				t.Fatalf("received %q, want %q", p, want)
			}
		case err := <-done:
			t.Fatalf("the subscription ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("%q was not received", want)
		}
	}
	if _, err := producer.Enqueue(ctx, wire.EnqueueRequest{Queue: "sub"}, []byte("before")); err != nil {
		t.Fatal(err)
	}
	receive("before")
	c.Crash(leader)
	c.Start(leader)
	if _, err := producer.Enqueue(ctx, wire.EnqueueRequest{Queue: "sub"}, []byte("after")); err != nil {
		t.Fatal(err)
	}
	receive("after")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the subscription ended with %v", err)
	}
}

// A subscription served by a follower leases no more than page_size
// messages at a time, as one served by the leader: the follower waits to
// have applied a delivery before it watches for its end.
func TestASubscriptionOnAFollowerKeepsToItsPageSize(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := c.RetryingClient(leader).Enqueue(ctx, wire.EnqueueRequest{Queue: "paged"}, []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, at := range others(c, leader) {
		var got []string
		err := c.Client(at).Subscribe(ctx, wire.DequeueRequest{Queue: "paged", Owner: "s", WaitSeconds: -1, PageSize: 1,
			VisibilityTimeoutSeconds: 60}, func(d *client.Delivery) error {
			got = append(got, string(d.Payload))
			return nil // neither acked nor handed back: it stays leased
		})
		if err != nil && !errors.Is(err, errcode.QueueEmpty) {
			t.Fatalf("subscription on %s: %v", c.Nodes[at].Name, err)
		}
		if len(got) != 1 {
			t.Fatalf("a subscription on follower %s with page_size 1 was sent %q", c.Nodes[at].Name, got)
		}
	}
	st, err := c.Client(leader).QueueStats(ctx, "", "paged", false)
	if err != nil || st.InFlight != 2 || st.Ready != 3 {
		t.Fatalf("stats after two subscriptions of one message each: %+v %v", st, err)
	}
}

// A subscription whose page is full, served by a follower that is cut off
// from the rest of its cluster, does not wait there for an end it cannot
// hear of: once a round passes without one, its server finds no leader to
// confirm the deliveries, the stream ends, and the client goes on through
// another server. The delivery it held was acked through the leader
// meanwhile; the next message reaches it.
func TestASubscriptionOnACutOffFollowerMovesOn(t *testing.T) {
	c, leader, at, lc := twoMessagesAndAFollower(t, "cutoff")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := client.New(c.URL(at)+","+c.URL(leader), client.WithRetry(15*time.Second), client.WithHTTPClient(c.HTTPClient("client")))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *client.Delivery, 2)
	done := make(chan error, 1)
	go func() {
		done <- sub.Subscribe(ctx, wire.DequeueRequest{Queue: "cutoff", Owner: "s", WaitSeconds: 1, PageSize: 1,
			VisibilityTimeoutSeconds: 300}, func(d *client.Delivery) error {
			got <- d
			return nil // still leased: the page is full
		})
	}()
	receive := func() *client.Delivery {
		t.Helper()
		d := receiveWithin(t, got, done, 25*time.Second)
		if d == nil {
			t.Fatal("nothing received")
		}
		return d
	}
	first := receive()
	if string(first.Payload) != "a" {
		t.Fatalf("the first delivery was %q", first.Payload)
	}
	testutil.WaitFor(t, 10*time.Second, "the follower to apply the delivery", func() bool {
		st, err := c.Client(at).QueueStats(ctx, "", "cutoff", true)
		return err == nil && st.InFlight == 1
	})
	c.Partition([]int{at}, others(c, at))
	defer c.Heal()
	// Cut off for good: the ack below cannot reach it.
	testutil.WaitFor(t, 10*time.Second, "the cut-off follower to lose its leader", func() bool {
		id, _ := c.Nodes[at].Server.Node().Leader()
		return id == ""
	})
	m := first.Message
	if _, err := lc.Ack(ctx, wire.AckRequest{Queue: m.Queue, MessageID: m.MessageID, LeaseID: m.LeaseID, FencingToken: m.FencingToken}); err != nil {
		t.Fatal(err)
	}
	if d := receive(); string(d.Payload) != "b" {
		t.Fatalf("after the ack the subscription received %q", d.Payload)
	}
	cancel()
	<-done
}

// A subscription on a follower that is cut off from the leader right after
// the leader answered its dequeue, before the follower applied the delivery,
// keeps to its page: without a leader to confirm the delivery, the
// follower's own state does not show it yet, and that is no end of it. The
// follower learns of the delivery only slowly (its link to the leader is
// slow and the log ahead of the delivery large), and is cut off as soon as
// the subscriber has the delivery; once the cluster heals, the next message
// comes only after the first is acked.
func TestASubscriptionOnAFollowerCutOffBeforeApplyingItsDeliveryKeepsToItsPageSize(t *testing.T) {
	c, leader, at, lc := twoMessagesAndAFollower(t, "cutpage")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.Fabric.Delay(c.Nodes[at].Name, c.Nodes[leader].Name, 100*time.Millisecond)
	defer c.Heal()
	// Ahead of the delivery in the log: the slow link takes a while to
	// carry this to the follower.
	bulk := make([]byte, 900<<10)
	for range 2 {
		if _, err := lc.Enqueue(ctx, wire.EnqueueRequest{Queue: "bulk"}, bulk); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan *client.Delivery, 4)
	done := make(chan error, 1)
	var heal *time.Timer
	go func() {
		done <- c.Client(at).Subscribe(ctx, wire.DequeueRequest{Queue: "cutpage", Owner: "s", WaitSeconds: 10, PageSize: 1,
			VisibilityTimeoutSeconds: 300}, func(d *client.Delivery) error {
			if heal == nil {
				c.Partition([]int{at}, others(c, at))
				// Healed once the follower has given up on asking the
				// leader (its leader wait is 2s), before a round of the
				// subscription's wait passes.
				heal = time.AfterFunc(3*time.Second, c.Heal)
			}
			got <- d
			return nil // unfinished: the page is full
		})
	}()
	receive := func(within time.Duration) *client.Delivery {
		t.Helper()
		return receiveWithin(t, got, done, within)
	}
	first := receive(30 * time.Second)
	if first == nil {
		t.Fatal("nothing received")
	}
	if d := receive(6 * time.Second); d != nil {
		t.Fatalf("a subscription with page_size 1 was sent %q while %q was unfinished", d.Payload, first.Payload)
	}
	m := first.Message
	if _, err := lc.Ack(ctx, wire.AckRequest{Queue: m.Queue, MessageID: m.MessageID, LeaseID: m.LeaseID, FencingToken: m.FencingToken}); err != nil {
		t.Fatal(err)
	}
	if d := receive(20 * time.Second); d == nil || string(d.Payload) == string(first.Payload) {
		t.Fatal("the next message did not follow the ack")
	}
	cancel()
	<-done
	heal.Stop()
}

// twoMessagesAndAFollower starts a cluster of three whose queue holds the
// messages "a" and "b", and returns it, its leader, a follower and a client
// of the leader.
func twoMessagesAndAFollower(t *testing.T, queue string) (*Cluster, int, int, *client.Client) {
	t.Helper()
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	lc := c.RetryingClient(leader)
	for _, p := range []string{"a", "b"} {
		if _, err := lc.Enqueue(context.Background(), wire.EnqueueRequest{Queue: queue}, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	return c, leader, others(c, leader)[0], lc
}

// receiveWithin returns the next delivery of a subscription (got), or nil
// when none comes within the time given; the subscription must not end
// (done) meanwhile.
func receiveWithin(t *testing.T, got <-chan *client.Delivery, done <-chan error, within time.Duration) *client.Delivery {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case d := <-got:
		return d
	case err := <-done:
		t.Fatalf("the subscription ended: %v", err)
	case <-timer.C:
	}
	return nil
}
