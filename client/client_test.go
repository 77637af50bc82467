package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testutil"
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
