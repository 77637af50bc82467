package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
)

// A scrape that cannot read the state leaves out what it would have read,
// instead of reporting zeros: a counter read as 0 and then as its value
// again looks to Prometheus like a reset and a jump.
func TestMetricsReadFromTheStateAreLeftOutWhenItCannotBeRead(t *testing.T) {
	srv, err := server.Start(testutil.Config(t, t.TempDir()), testutil.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	fams, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, want := range []string{"raftlockd_leases_held", "raftlockd_utxo_pruned_total"} {
		if !names[want] {
			t.Fatalf("a running server's scrape has no %s", want)
		}
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The state file is closed now.
	fams, _ = srv.Registry().Gather()
	for _, f := range fams {
		if n := f.GetName(); n == "raftlockd_leases_held" || n == "raftlockd_waiters_queued" || strings.HasPrefix(n, "raftlockd_utxo_") &&
			!strings.HasSuffix(n, "_seconds") && !strings.HasSuffix(n, "_size") {
			t.Errorf("with the state unreadable, the scrape reports %s: %v", n, f.GetMetric()[0])
		}
	}
}
