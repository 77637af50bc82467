package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/lockedbuf"
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
	c := testutil.Client(t, srv.URL(), client.WithRetry(0))
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

// A connection on which no request has begun (a client's transport often
// holds one) does not hold shutdown up; http.Server would wait five seconds
// for it.
func TestShutdownDoesNotWaitForConnectionsWithoutARequest(t *testing.T) {
	srv, err := server.Start(testutil.Config(t, t.TempDir()), testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "leader", srv.Node().IsLeader)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, auth.ClientConfig(testutil.ClientBundle(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The server has accepted it once it answers a request on another.
	c := testutil.Client(t, srv.URL(), client.WithRetry(0))
	if _, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Owner: "a", TTLSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("shutdown waited %s for a connection without a request", took)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection without a request is still open")
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

// A data directory whose node has kept a Raft log stays that node's: a
// start under another id is refused (Raft would never count it a voter),
// and a start without one takes the id it was given before.
func TestADataDirectoryKeepsItsNode(t *testing.T) {
	dir := t.TempDir()
	cfg := testutil.Config(t, dir)
	cfg.NodeID = "first"
	srv, err := server.Start(cfg, testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg.NodeID = "second"
	if _, err := server.Start(cfg, testutil.Logger(t)); err == nil || !strings.Contains(err.Error(), `belongs to node "first"`) {
		t.Fatalf("a start under another id: %v", err)
	}
	cfg.NodeID = ""
	if id, err := server.NodeID(cfg); err != nil || id != "first" {
		t.Fatalf("the id of a start without one: %q, %v", id, err)
	}
}

// A server whose bundle is bound to a node id runs as that node: without
// --node-id it takes the id, and it refuses another one, configured or
// kept in its data directory.
func TestABundleBoundToANodeGivesItsID(t *testing.T) {
	dir := t.TempDir()
	cfg := testutil.Config(t, dir)
	b := testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: "n1", Hosts: []string{"127.0.0.1"}, Node: "n1"})
	if err := b.WriteFile(cfg.Bundle); err != nil {
		t.Fatal(err)
	}
	srv := testutil.StartServer(t, cfg)
	if id := srv.Node().ID(); id != "n1" {
		t.Fatalf("the node of a bundle bound to n1 runs as %q", id)
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg.NodeID = "n2"
	if _, err := server.Start(cfg, testutil.Logger(t)); err == nil || !strings.Contains(err.Error(), `is node "n1"'s, but this server is node "n2"`) {
		t.Fatalf("start as n2 with n1's bundle: %v", err)
	}
	// A data directory of another node, with n1's bundle.
	other := testutil.Config(t, t.TempDir())
	other.NodeID = "n3"
	if _, err := server.NodeID(other); err != nil {
		t.Fatal(err)
	}
	other.NodeID, other.Bundle = "", cfg.Bundle
	if _, err := server.Start(other, testutil.Logger(t)); err == nil || !strings.Contains(err.Error(), `this server is node "n3"`) {
		t.Fatalf("start of n3's data directory with n1's bundle: %v", err)
	}
}

// A node started with --disable-mtls says at every start that it serves
// plain HTTP; a node with its bundle serves HTTPS and says nothing of the
// kind.
func TestDisabledMTLSIsAnnouncedAtEveryStart(t *testing.T) {
	dir := t.TempDir()
	for _, disable := range []bool{true, true, false} {
		var buf lockedbuf.Buffer
		cfg := testutil.Config(t, dir)
		cfg.DisableMTLS = disable
		srv, err := server.Start(cfg, slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
		url := srv.URL()
		if err := srv.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		warned := strings.Contains(out, "level=WARN") && strings.Contains(out, "mTLS is disabled")
		if warned != disable {
			t.Fatalf("disable-mtls=%v: warning logged: %v:\n%s", disable, warned, out)
		}
		if want := map[bool]string{true: "http://", false: "https://"}[disable]; !strings.HasPrefix(url, want) {
			t.Fatalf("disable-mtls=%v: the API is at %s", disable, url)
		}
	}
}

// The single-node default creates its CA and bundles in the data directory
// on first start, keeps them on the next, and a client holding the
// created client bundle is served.
func TestSingleNodeDefaultCreatesItsBundles(t *testing.T) {
	var buf lockedbuf.Buffer
	cfg := testutil.Config(t, t.TempDir())
	cfg.Bundle = ""
	cfg.Listen = testutil.FreeAddr(t) // kept across the restart; the certificate names it
	srv, err := server.Start(cfg, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	testutil.WaitFor(t, 10*time.Second, "leader", srv.Node().IsLeader)
	if !strings.Contains(buf.String(), filepath.Join(cfg.TLSDir(), auth.ClientFile)) {
		t.Fatalf("the log does not say where the client bundle is:\n%s", buf.String())
	}
	cl, err := auth.LoadBundle(filepath.Join(cfg.TLSDir(), auth.ClientFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(srv.URL(), client.WithBundle(cl), client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "a", TTLSeconds: 30}); err != nil {
		t.Fatalf("with the created client bundle: %v", err)
	}
	// A client of another CA does not get in.
	if _, err := testutil.Client(t, srv.URL(), client.WithRetry(0)).Describe(ctx, "", "k"); err == nil {
		t.Fatal("a client of another CA was served")
	}
	before, err := os.ReadFile(filepath.Join(cfg.TLSDir(), auth.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	srv = testutil.StartServer(t, cfg)
	after, err := os.ReadFile(filepath.Join(cfg.TLSDir(), auth.CAFile))
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the CA changed across a restart (%v)", err)
	}
	if _, err := c.Describe(ctx, "", "k"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// A node configured to form or join a cluster does not invent a CA of its
// own: without a bundle it refuses to start and says what to do.
func TestClusterNodeWithoutBundleIsRefused(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.Bundle = ""
	cfg.BootstrapExpect = 3
	_, err := server.Start(cfg, testutil.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "auth new cluster") {
		t.Fatalf("start without a bundle: %v", err)
	}
	if _, err := os.Stat(cfg.TLSDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a bundle directory was created: %v", err)
	}
}

func TestInvalidConfigIsRejected(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.DefaultTTL = 2 * time.Hour
	if _, err := server.Start(cfg, testutil.Logger(t)); err == nil {
		t.Fatal("default TTL above the maximum accepted")
	}
}

// expiresAtMs reads the replicated expiry (Unix ms) of the lease on key.
func expiresAtMs(t *testing.T, srv *server.Server, key string) (string, int64) {
	t.Helper()
	var id string
	var at int64
	err := srv.Node().FSM().View(func(v *fsm.View) error {
		if rec, ok := v.Key("default", key); ok && rec.Lease != nil {
			id, at = rec.Lease.ID, rec.Lease.ExpiresAt
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, at
}

// A restart is a leader change: the lease keeps its absolute expiry (its
// remaining TTL), it is not granted a fresh TTL, and the new leader expires
// it on time.
func TestLeaseKeepsItsRemainingTTLAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testutil.Config(t, dir)
	cfg.RaftListen = testutil.FreeAddr(t)
	srv := testutil.StartServer(t, cfg)
	c := testutil.Client(t, srv.URL())
	ctx := context.Background()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "ttl", Owner: "a", TTLSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	_, before := expiresAtMs(t, srv, "ttl")
	clockBefore := srv.Node().FSM().Now()
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Once the new term has applied an entry stamped later than anything
	// before the restart, a lease given a fresh TTL would expire later
	// than before, to the millisecond.
	srv = testutil.StartServer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "an entry of the new term", func() bool {
		return srv.Node().FSM().Now() > clockBefore
	})
	c = testutil.Client(t, srv.URL())
	if id, after := expiresAtMs(t, srv, "ttl"); id != l.LeaseID || after != before {
		t.Fatalf("after restart: lease %s expiring at %d ms, want %s expiring at %d ms", id, after, l.LeaseID, before)
	}
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

func TestPlainHTTPOnTheTLSPortGetsAJSONError(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	plain := strings.Replace(srv.URL(), "https://", "http://", 1)
	res, err := http.Post(plain+"/v1/acquire", "application/json", strings.NewReader(`{"key":"k","owner":"o"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var env errcode.Error
	if err := json.NewDecoder(res.Body).Decode(&env); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if res.StatusCode != http.StatusBadRequest || env.Code != errcode.TLSRequired.Code ||
		res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, %s, %+v", res.StatusCode, res.Header.Get("Content-Type"), env)
	}
	// TLS clients are served as before.
	c := testutil.Client(t, srv.URL(), client.WithRetry(0))
	if _, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Owner: "a", TTLSeconds: 60}); err != nil {
		t.Fatal(err)
	}
}
