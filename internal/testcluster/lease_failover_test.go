package testcluster

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

// A blocked acquirer whose client goes away while its server cannot reach
// a leader (for longer than the server waits for one) still leaves the
// key's queue once a leader is back: the next release does not hand the
// key to nobody for the waiter's whole TTL.
func TestAWaiterWhoseClientLeftDuringAnOutageIsNotGrantedTheKey(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rest := others(c, leader)
	waiterNode, other := rest[0], rest[1]
	held := acquire(t, c.Client(leader), "k", 60)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Client(waiterNode).Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "gone", TTLSeconds: 60, BlockSecs: 30})
		done <- err
	}()
	waitQueued(t, c.Client(leader), "k", 1)

	// The waiter's server is cut off from the others, which keep a
	// quorum; its client gives up meanwhile.
	c.Partition([]int{waiterNode}, []int{leader, other})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled acquire got the lease")
	}
	// The outage lasts longer than the server waits for a leader.
	time.Sleep(c.Nodes[waiterNode].Config.LeaderWait + time.Second)
	c.Heal()

	waitFor(t, 15*time.Second, "the waiter to leave the queue", func() bool {
		d, err := c.Client(leader).Describe(context.Background(), "", "k")
		return err == nil && d.Waiters == 0
	})
	if _, err := c.RetryingClient(leader).Release(context.Background(), held.Ref(), false); err != nil {
		t.Fatal(err)
	}
	d, err := c.RetryingClient(leader).Describe(context.Background(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.LeaseID != "" {
		t.Fatalf("the key went to the acquirer whose client left: %+v", d)
	}
}

// The leader a response names (X-Raftlockd-Leader) is the one its node
// knows when it answers: a blocked acquire answered after a failover
// names the new leader, not the one that led when the request arrived.
func TestABlockedAcquireAnsweredAfterAFailoverNamesTheNewLeader(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rest := others(c, leader)
	waiterNode, other := rest[0], rest[1]
	held := acquire(t, c.Client(other), "k", 60)

	type answer struct {
		status int
		leader string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		body := strings.NewReader(`{"key":"k","owner":"w","ttl_seconds":30,"block_seconds":30}`)
		resp, err := c.HTTPClient("client").Post(c.URL(waiterNode)+"/v1/acquire", "application/json", body)
		if err != nil {
			got <- answer{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- answer{status: resp.StatusCode, leader: resp.Header.Get(wire.HeaderLeader)}
	}()
	waitQueued(t, c.Client(other), "k", 1)

	c.Stop(leader)
	next := c.WaitLeader(10 * time.Second)
	if _, err := c.RetryingClient(other).Release(context.Background(), held.Ref(), false); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("blocked acquire: %d %v", a.status, a.err)
		}
		if a.leader != c.Nodes[next].Name {
			t.Fatalf("the answer names leader %q; %s leads", a.leader, c.Nodes[next].Name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked acquire was not answered")
	}
}

// A consumer whose client leaves while its server cannot reach a leader
// leaves the queue once one is reached: a message enqueued after the
// outage is ready for the next consumer, not leased to one that is gone
// until its visibility runs out.
func TestAConsumerWhoseClientLeftDuringAnOutageIsHandedNothing(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	rest := others(c, leader)
	waiterNode, other := rest[0], rest[1]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Client(waiterNode).Dequeue(ctx, wire.DequeueRequest{Queue: "jobs", Owner: "gone", WaitSeconds: 30,
			VisibilityTimeoutSeconds: 600})
		done <- err
	}()
	waitFor(t, 5*time.Second, "the consumer to wait", func() bool {
		st, err := c.Client(leader).QueueStats(context.Background(), "", "jobs", false)
		return err == nil && st.WaitingConsumers == 1
	})

	c.Partition([]int{waiterNode}, []int{leader, other})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled dequeue got a message")
	}
	// The outage lasts longer than the server waits for a leader.
	time.Sleep(c.Nodes[waiterNode].Config.LeaderWait + time.Second)
	c.Heal()

	waitFor(t, 15*time.Second, "the consumer to leave the queue", func() bool {
		st, err := c.Client(leader).QueueStats(context.Background(), "", "jobs", false)
		return err == nil && st.WaitingConsumers == 0
	})
	if _, err := c.RetryingClient(leader).Enqueue(context.Background(), wire.EnqueueRequest{Queue: "jobs"}, []byte("j")); err != nil {
		t.Fatal(err)
	}
	st, err := c.RetryingClient(leader).QueueStats(context.Background(), "", "jobs", false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 1 || st.InFlight != 0 {
		t.Fatalf("the message went to the consumer whose client left: %+v", st)
	}
}
