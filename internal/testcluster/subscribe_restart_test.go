package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A subscription still waiting for its first delivery (the queue is empty,
// so the server has not answered yet) goes on when its node restarts, as
// one whose stream already began does.
func TestAnIdleSubscriptionOutlivesARestartOfItsNode(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	at := others(c, leader)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := make(chan string, 4)
	done := make(chan error, 1)
	go func() {
		done <- c.RetryingClient(at).Subscribe(ctx, wire.DequeueRequest{Queue: "idle", Owner: "s", WaitSeconds: 10},
			func(d *client.Delivery) error {
				got <- string(d.Payload)
				return d.Ack(ctx)
			})
	}()
	testutil.WaitFor(t, 10*time.Second, "the subscription to wait for a first message", func() bool {
		st, err := c.RetryingClient(leader).QueueStats(ctx, "", "idle", false)
		return err == nil && st.WaitingConsumers == 1
	})
	c.Stop(at)
	c.Start(at)
	if _, err := c.RetryingClient(leader).Enqueue(ctx, wire.EnqueueRequest{Queue: "idle"}, []byte("after")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p != "after" {
			t.Fatalf("received %q", p)
		}
	case err := <-done:
		t.Fatalf("the subscription ended when its node restarted: %v", err)
	case <-ctx.Done():
		t.Fatal("nothing received")
	}
	cancel()
	<-done
}
