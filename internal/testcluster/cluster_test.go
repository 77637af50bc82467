package testcluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func acquire(t *testing.T, c *client.Client, key string, ttl int64) *client.Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: key, Owner: "t", TTLSeconds: ttl, BlockSecs: -1})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return l
}

func commit(t *testing.T, l *client.Lease, doc string) {
	t.Helper()
	ctx := context.Background()
	if _, err := l.Update(ctx, []byte(doc), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, false); err != nil {
		t.Fatal(err)
	}
}

func others(c *Cluster, except ...int) []int {
	var out []int
	for _, i := range c.Running() {
		skip := false
		for _, e := range except {
			skip = skip || i == e
		}
		if !skip {
			out = append(out, i)
		}
	}
	return out
}

// Any node serves any request: writes reaching followers are forwarded and
// reads on followers see every acknowledged write.
func TestAnyNodeServesAnyRequest(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	for i := range c.Nodes {
		l := acquire(t, c.Client(i), "k", 30)
		commit(t, l, `{"by":"`+c.Nodes[i].Name+`"}`)
		for j := range c.Nodes {
			d, err := c.Client(j).GetPublic(ctx, "", "k")
			if err != nil || string(d.Body) != `{"by":"`+c.Nodes[i].Name+`"}` {
				t.Fatalf("read on %s after write on %s: %q %v", c.Nodes[j].Name, c.Nodes[i].Name, d.Body, err)
			}
		}
	}
	c.WaitConverged(10 * time.Second)
}

// A minority accepts no writes, the majority keeps serving, and after the
// partition heals every node holds identical state.
func TestMinorityPartitionAcceptsNoWrites(t *testing.T) {
	c := Start(t, 3)
	old := c.Leader()
	majority := others(c, old)
	c.Partition([]int{old}, majority)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Client(old).Acquire(ctx, wire.AcquireRequest{Key: "minority", Owner: "t", BlockSecs: -1})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 503 || e.Envelope.RetryAfter == 0 {
		t.Fatalf("write on the minority side: %v", err)
	}
	for _, i := range majority {
		commit(t, acquire(t, c.RetryingClient(i), "majority-"+c.Nodes[i].Name, 30), `{"ok":true}`)
	}
	c.Heal()
	c.WaitConverged(15 * time.Second)
	d, err := c.Client(old).GetPublic(context.Background(), "", "minority")
	if err != nil || d.Exists {
		t.Fatalf("minority write became visible: %+v %v", d, err)
	}
	for _, i := range majority {
		if d, err := c.Client(old).GetPublic(context.Background(), "", "majority-"+c.Nodes[i].Name); err != nil || !d.Exists {
			t.Fatalf("majority write missing on the healed node: %+v %v", d, err)
		}
	}
}

// Leadership changes are invisible to lease users: a queued acquirer on a
// surviving node is served by the new leader, remaining TTLs are kept and
// fencing tokens keep growing.
func TestFailoverKeepsLeasesQueuesAndTokens(t *testing.T) {
	c := Start(t, 3)
	leader := c.Leader()
	rest := others(c, leader)
	waiterNode, other := rest[0], rest[1]
	ctx := context.Background()

	held := acquire(t, c.Client(other), "queued", 60)
	short := acquire(t, c.Client(other), "short", 3)
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Client(waiterNode).Acquire(ctx, wire.AcquireRequest{Key: "queued", Owner: "w", TTLSeconds: 30, BlockSecs: 30})
		if err != nil {
			t.Errorf("queued acquire: %v", err)
		}
		got <- l
	}()
	waitQueued(t, c.Client(other), "queued", 1)

	c.Stop(leader)
	c.WaitLeader(10 * time.Second)
	if _, err := c.RetryingClient(other).Release(ctx, held.Ref(), false); err != nil {
		t.Fatalf("release after failover: %v", err)
	}
	select {
	case l := <-got:
		if l == nil || l.FencingToken != held.FencingToken+1 {
			t.Fatalf("queued acquirer got %+v", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("queued acquirer was not served after failover")
	}
	// The short lease keeps its deadline across the failover.
	d, err := c.RetryingClient(other).Describe(ctx, "", "short")
	if err != nil || d.ExpiresAt != short.ExpiresAt {
		t.Fatalf("short lease after failover: %+v %v (want expiry %d)", d, err, short.ExpiresAt)
	}
	deadline := time.Unix(short.ExpiresAt, 0)
	waitFor(t, 10*time.Second, "the short lease to expire", func() bool {
		d, err := c.Client(other).Describe(ctx, "", "short")
		return err == nil && d.LeaseID == ""
	})
	if late := time.Since(deadline); late > 2*time.Second {
		t.Fatalf("lease expired %s after its deadline", late)
	}
	next := acquire(t, c.Client(waiterNode), "short", 30)
	if next.FencingToken != short.FencingToken+1 {
		t.Fatalf("token after failover %d, want %d", next.FencingToken, short.FencingToken+1)
	}
	c.Start(leader)
	c.WaitConverged(15 * time.Second)
}

func waitQueued(t *testing.T, c *client.Client, key string, n int64) {
	t.Helper()
	waitFor(t, 5*time.Second, "the acquire to queue", func() bool {
		d, err := c.Describe(context.Background(), "", key)
		return err == nil && d.Waiters == n
	})
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = errcode.NoLeader
