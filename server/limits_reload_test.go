package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A keepalive that keeps a lease's own TTL (ttl_seconds 0) extends it by
// the --max-ttl in force, not by a TTL a longer maximum allowed when the
// lease was acquired: after a restart with a lower --max-ttl, a lease of an
// hour is kept alive for the new maximum at most.
func TestKeepAliveHonoursALoweredMaxTTL(t *testing.T) {
	dir := t.TempDir()
	cfg := testutil.Config(t, dir)
	cfg.RaftListen = testutil.FreeAddr(t) // kept across the restart
	srv := testutil.StartServer(t, cfg)
	ctx := context.Background()
	l, err := testutil.Client(t, srv.URL()).Acquire(ctx, wire.AcquireRequest{Key: "long", Owner: "a", TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}

	cfg.MaxTTL = time.Minute
	srv = testutil.StartServer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "the island to follow this build's rules", func() bool {
		return srv.Node().FSM().Rules() >= fsm.EntryFormat
	})
	c := testutil.Client(t, srv.URL())
	for _, ttl := range []time.Duration{0, 2 * time.Hour, 0} {
		ka, err := c.KeepAlive(ctx, l.Ref(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if limit := time.Now().Add(cfg.MaxTTL + 2*time.Second).Unix(); ka.ExpiresAt > limit {
			t.Fatalf("keepalive (ttl %s) under --max-ttl %s: expires in %s",
				ttl, cfg.MaxTTL, time.Until(time.Unix(ka.ExpiresAt, 0)).Round(time.Second))
		}
	}
}

// A --queue-visibility above the built-in 12h maximum raises the maximum
// with it: a delivery asking for a visibility timeout between the two gets
// it, rather than less than one that asks for none.
func TestALongQueueVisibilityRaisesTheMaximum(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.QueueVisibility = 24 * time.Hour
	srv := testutil.StartServer(t, cfg)
	c := testutil.Client(t, srv.URL())
	ctx := context.Background()
	for _, vis := range []time.Duration{0, 20 * time.Hour} {
		if _, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "q", VisibilityTimeoutSeconds: int64(vis / time.Second)}, []byte("x")); err != nil {
			t.Fatal(err)
		}
		d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "q", Owner: "w"})
		if err != nil {
			t.Fatal(err)
		}
		want := vis
		if vis == 0 {
			want = cfg.QueueVisibility
		}
		if got := time.Duration(d.Message.VisibilityTimeoutSeconds) * time.Second; got != want {
			t.Errorf("enqueued with visibility_timeout_seconds %d under --queue-visibility %s: delivered for %s, want %s",
				int64(vis/time.Second), cfg.QueueVisibility, got, want)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
