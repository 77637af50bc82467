package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A node that shuts down while it forwards an enqueue to the leader answers
// shutdown_draining although the leader may have applied the enqueue: a
// call without an idempotency key is not sent again, or the message would
// be enqueued twice once the node (or another behind the same address)
// answers the retry.
func TestEnqueueCutShortByAShutdownIsNotRepeated(t *testing.T) {
	c := testcluster.Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	f := (leader + 1) % 3
	// Forwarding takes a while, so that the follower can be stopped after
	// the leader applied the enqueue and before its answer arrives.
	c.Fabric.Delay(c.Nodes[leader].Name, c.Nodes[f].Name, 500*time.Millisecond)
	producer := c.RetryingClient(f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := producer.EnqueueWithKey(ctx, wire.EnqueueRequest{Queue: "once"}, []byte("m"), "")
		errc <- err
	}()
	watcher := c.Client(leader)
	ready := func() int {
		st, err := watcher.QueueStats(ctx, "", "once", true)
		if err != nil {
			return -1
		}
		return st.Ready
	}
	testutil.WaitFor(t, 10*time.Second, "the leader to apply the enqueue", func() bool { return ready() == 1 })
	c.Stop(f)
	c.Fabric.Heal()
	c.Start(f)
	select {
	case err := <-errc:
		t.Logf("enqueue answered %v", err)
	case <-ctx.Done():
		t.Fatal("the enqueue never returned")
	}
	if n := ready(); n != 1 {
		t.Fatalf("the queue holds %d messages after one enqueue, want 1", n)
	}
}

// A call whose context ends while it waits to retry reports the context's
// end, and still the last answer it had.
func TestACallCancelledBetweenRetriesSaysSo(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"no_leader","detail":"no leader yet","retry_after_seconds":1}`))
	}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	_, err = c.Describe(ctx, "default", "k")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errcode.NoLeader) {
		t.Fatalf("a call whose deadline passed between retries: %v; want the deadline and the last answer", err)
	}
}

// A snapshot whose bytes do not have the SHA-256 the server sent with it
// is reported as damaged rather than saved as if whole.
func TestSaveSnapshotChecksTheServersChecksum(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(wire.HeaderSnapshotSHA256, strings.Repeat("0", 64))
		_, _ = w.Write([]byte("state file"))
	}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := c.SaveSnapshot(context.Background(), &got, nil); err == nil || !strings.Contains(err.Error(), "does not match the SHA-256") {
		t.Fatalf("save of a stream that does not match its checksum: %v", err)
	}
}

// A client given several servers of a cluster moves on to the next when
// the one it uses stops: the lease it holds is kept alive, updated and
// released through another server, as if nothing happened.
func TestAClientOfSeveralServersMovesOnWhenItsServerStops(t *testing.T) {
	c := testcluster.Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	first := (leader + 1) % 3 // a follower: stopping it leaves the cluster a leader
	urls := []string{c.URL(first), c.URL((first + 1) % 3), c.URL((first + 2) % 3)}
	cl, err := client.New(strings.Join(urls, ","), client.WithRetry(15*time.Second), client.WithHTTPClient(c.HTTPClient("client")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := cl.Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "o", TTLSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Update(ctx, []byte(`{"n":1}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	c.Stop(first)
	if _, err := l.KeepAlive(ctx, 0); err != nil {
		t.Fatalf("keepalive once the client's server stopped: %v", err)
	}
	if _, err := l.Update(ctx, []byte(`{"n":2}`), client.Conditions{}); err != nil {
		t.Fatalf("update once the client's server stopped: %v", err)
	}
	if err := l.Release(ctx, false); err != nil {
		t.Fatalf("release once the client's server stopped: %v", err)
	}
	d, err := cl.GetPublic(ctx, "", "k")
	if err != nil || string(d.Body) != `{"n":2}` {
		t.Fatalf("the committed document: %+v, %v; want {\"n\":2}", d, err)
	}
}

// A server of the list that cannot be reached costs a call no retry time:
// the next is tried at once, even by a client that does not retry.
func TestAnUnreachableServerOfTheListIsPassedOver(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	down := "https://" + testutil.FreeAddr(t)
	c := testutil.Client(t, down+","+srv.URL(), client.WithRetry(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		if _, err := c.Describe(ctx, "", "k"); err != nil {
			t.Fatalf("call %d with the first server of the list down: %v", i, err)
		}
	}
}

// A leave asks the server that serves it to leave the cluster: when the
// server in use cannot be reached, the leave fails instead of making the
// next server of the list leave in its place.
func TestALeaveIsNotPassedOnToAnotherServer(t *testing.T) {
	// Four voters: with one down, another may still leave.
	c := testcluster.Start(t, 4)
	leader := c.WaitLeader(10 * time.Second)
	down, up := (leader+1)%4, (leader+2)%4
	urls := c.URL(down) + "," + c.URL(up)
	c.Stop(down)
	op, err := client.New(urls, client.WithRetry(time.Second),
		client.WithHTTPClient(c.OperatorHTTPClient("operator")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, leave := range map[string]func() error{
		"cluster leave": func() error { _, err := op.ClusterLeave(ctx); return err },
		"tc leave":      func() error { _, err := op.TCLeave(ctx, ""); return err },
	} {
		err := leave()
		if err == nil {
			t.Fatalf("%s with the server in use down succeeded", name)
		}
		m, err := c.Operator(leader).ClusterMembers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range m.Members {
			if s.ID == c.Nodes[up].Name && s.Suffrage != "voter" {
				t.Fatalf("%s through a list whose first server is down made %s leave: %+v", name, s.ID, s)
			}
		}
	}
}

// A restore through a list of servers whose first cannot be reached goes
// to the next, as every other call does.
func TestARestorePassesOverAnUnreachableServer(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var backup bytes.Buffer
	if _, err := testutil.OperatorClient(t, srv.URL()).SaveSnapshot(ctx, &backup, nil); err != nil {
		t.Fatal(err)
	}
	c := testutil.OperatorClient(t, "https://"+testutil.FreeAddr(t)+","+srv.URL(), client.WithRetry(time.Second))
	if _, err := c.RestoreSnapshot(ctx, bytes.NewReader(backup.Bytes()), int64(backup.Len()), nil); err != nil {
		t.Fatalf("restore with the first server of the list down: %v", err)
	}
}
