package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/wire"
)

// A write sent to a follower that cannot reach the leader ends when the
// client's X-Raftlockd-Timeout is up, not after the server's own leader
// wait; with a healthy cluster the same request, forwarded with that
// deadline, completes within it.
func TestTimeoutHeaderBoundsForwardedWrites(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.Configure(func(s *config.Server) { s.LeaderWait = 15 * time.Second }))
	leader := c.WaitLeader(10 * time.Second)
	var followers []int
	for _, i := range c.Running() {
		if i != leader {
			followers = append(followers, i)
		}
	}
	send := func(node int, key, timeout string) (resp, time.Duration) {
		t.Helper()
		e := envOf(t, c.Nodes[node].Server)
		start := time.Now()
		r := e.post("/v1/acquire", map[string]string{wire.HeaderTimeout: timeout},
			wire.AcquireRequest{Key: key, Owner: "o", TTLSeconds: 30, BlockSecs: -1})
		return r, time.Since(start)
	}

	r, took := send(followers[0], "healthy", "5s")
	if r.status != http.StatusOK || took > 5*time.Second {
		t.Fatalf("forwarded acquire with a 5s timeout: %d %s after %s", r.status, r.body, took)
	}

	cut := followers[1]
	var rest []int
	for _, i := range c.Running() {
		if i != cut {
			rest = append(rest, i)
		}
	}
	c.Partition([]int{cut}, rest)
	defer c.Heal()
	r, took = send(cut, "cut-off", "700ms")
	if took > 5*time.Second {
		t.Fatalf("a write with a 700ms timeout on a cut-off follower took %s", took)
	}
	env := wantErr(t, r, http.StatusServiceUnavailable, "unavailable")
	if d, _ := env["detail"].(string); !strings.Contains(d, wire.HeaderTimeout) {
		t.Fatalf("the answer does not name the timeout: %v", env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.Heal()
	if _, err := c.RetryingClient(cut).Describe(ctx, "", "healthy"); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}
