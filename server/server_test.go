package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"))
}

func TestShutdownReleasesWaitingRequests(t *testing.T) {
	srv, err := server.Start(testutil.Config(t, t.TempDir()), testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "leader", srv.Node().IsLeader)
	c, _ := client.New(srv.URL(), client.WithRetry(0))
	ctx := context.Background()
	if _, err := c.Acquire(ctx, wire.AcquireRequest{Key: "held", Owner: "a", TTLSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "held", Owner: "b", BlockSecs: 50})
		errc <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "the acquire to queue", func() bool {
		d, err := c.Describe(ctx, "", "held")
		return err == nil && d.Waiters == 1
	})
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := srv.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown waited %s for a blocked acquire", took)
	}
	if err := <-errc; !errors.Is(err, errcode.ShuttingDown) {
		t.Fatalf("blocked acquire got %v, want shutdown_draining", err)
	}
}

func TestNodeIDIsKeptInTheDataDir(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	a, err := server.NodeID(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := server.NodeID(cfg)
	if a == "" || a != b {
		t.Fatalf("node ids %q, %q", a, b)
	}
	cfg.NodeID = "explicit"
	if id, _ := server.NodeID(cfg); id != "explicit" {
		t.Fatalf("explicit id ignored: %q", id)
	}
}

func TestInvalidConfigIsRejected(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.DefaultTTL = 2 * time.Hour
	if _, err := server.Start(cfg, testutil.Logger(t)); err == nil {
		t.Fatal("default TTL above the maximum accepted")
	}
}

// A restart is a leader change: the lease keeps its absolute expiry (its
// remaining TTL), it is not granted a fresh TTL, and the new leader expires
// it on time.
func TestLeaseKeepsItsRemainingTTLAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testutil.Config(t, dir)
	cfg.RaftListen = testutil.FreeAddr(t)
	srv := testutil.StartServer(t, cfg)
	c, _ := client.New(srv.URL())
	ctx := context.Background()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "ttl", Owner: "a", TTLSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the node is down for a while

	srv = testutil.StartServer(t, cfg)
	c, _ = client.New(srv.URL())
	d, err := c.Describe(ctx, "", "ttl")
	if err != nil {
		t.Fatal(err)
	}
	if d.LeaseID != l.LeaseID || d.ExpiresAt != l.ExpiresAt {
		t.Fatalf("after restart: lease %s expiring %d, want %s expiring %d", d.LeaseID, d.ExpiresAt, l.LeaseID, l.ExpiresAt)
	}
	testutil.WaitFor(t, 10*time.Second, "the lease to expire", func() bool {
		d, err := c.Describe(ctx, "", "ttl")
		return err == nil && d.LeaseID == ""
	})
	if late := time.Since(time.Unix(l.ExpiresAt, 0)); late > 2*time.Second {
		t.Fatalf("lease expired %s after its deadline", late)
	}
	next, err := c.Acquire(ctx, wire.AcquireRequest{Key: "ttl", Owner: "b", BlockSecs: -1})
	if err != nil {
		t.Fatal(err)
	}
	if next.FencingToken != l.FencingToken+1 {
		t.Fatalf("token after restart %d, want %d", next.FencingToken, l.FencingToken+1)
	}
}
