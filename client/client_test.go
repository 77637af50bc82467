package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A bundle given after an HTTP client that leaves its Transport to Go's
// default (as one set only for its Timeout does) is still presented.
func TestBundleAppliesToAnHTTPClientWithTheDefaultTransport(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	c, err := client.New(srv.URL(), client.WithRetry(0), client.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}),
		client.WithBundle(testutil.ClientBundle(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Describe(ctx, "", "k"); err != nil {
		t.Fatalf("describe with the bundle: %v", err)
	}
}

// A keepalive of less than a second extends the lease by a second, not by
// the lease's own (here much longer) TTL, which is what a ttl of 0 asks for.
func TestKeepAliveOfLessThanASecondExtendsByASecond(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	c := testutil.Client(t, srv.URL(), client.WithRetry(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "o", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Unix()
	out, err := l.KeepAlive(ctx, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if late := out.ExpiresAt - before; late > 2 {
		t.Fatalf("a keepalive of 500ms made the lease expire %ds from now, want about 1s", late)
	}
}
