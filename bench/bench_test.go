package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
)

func TestSummarizePercentiles(t *testing.T) {
	ms := time.Millisecond
	// 100 samples of 1..100ms, shuffled: p50 lies halfway between the 50th
	// and the 51st, p99 between the 99th and the maximum.
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*ms)
	}
	s[0], s[57] = s[57], s[0]
	var r Result
	r.Elapsed = 2 * time.Second
	r.summarize(s)
	if r.Ops != 100 || r.OpsPerSec != 50 {
		t.Fatalf("ops %d, %v/s", r.Ops, r.OpsPerSec)
	}
	if r.P50 != 50*ms+500*time.Microsecond || r.P95 != 95*ms+50*time.Microsecond || r.P99 != 99*ms+10*time.Microsecond ||
		r.Max != 100*ms {
		t.Fatalf("p50 %v p95 %v p99 %v max %v", r.P50, r.P95, r.P99, r.Max)
	}
	for _, c := range []struct {
		samples       []time.Duration
		p50, p99, max time.Duration
	}{
		{[]time.Duration{7 * ms}, 7 * ms, 7 * ms, 7 * ms},
		{[]time.Duration{4 * ms, 2 * ms}, 3 * ms, 3*ms + 980*time.Microsecond, 4 * ms},
		{[]time.Duration{1 * ms, 2 * ms, 3 * ms}, 2 * ms, 2*ms + 980*time.Microsecond, 3 * ms},
	} {
		var r Result
		r.summarize(c.samples)
		if r.P50 != c.p50 || r.P99 != c.p99 || r.Max != c.max {
			t.Errorf("%v: p50 %v p99 %v max %v, want %v %v %v", c.samples, r.P50, r.P99, r.Max, c.p50, c.p99, c.max)
		}
	}
	if got := Summarize([]time.Duration{4 * ms, 1 * ms, 2 * ms, 3 * ms}); got != "min 1.00ms, median 2.50ms, max 4.00ms" {
		t.Errorf("Summarize: %s", got)
	}
}

func TestRunWithoutSamplesShowsNoLatency(t *testing.T) {
	var r Result
	r.System, r.Workload, r.Clients, r.Errors, r.Elapsed = "s", Lock, 1, 3, time.Second
	r.summarize(nil)
	if r.Ops != 0 || r.OpsPerSec != 0 || r.P50 != 0 || r.P99 != 0 || r.Max != 0 {
		t.Fatalf("empty: %+v", r)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, []Result{r}); err != nil {
		t.Fatal(err)
	}
	if line := strings.Split(b.String(), "\n")[1]; strings.Contains(line, "0.00ms") || !strings.Contains(line, " - ") {
		t.Fatalf("a run without samples shows latencies: %q", line)
	}
}

// cancelling is a driver whose lock cycles end the bench's context (an
// interrupt) after a few operations.
type cancelling struct {
	fake
	mu     sync.Mutex
	ops    int
	after  int
	cancel context.CancelFunc
}

func (c *cancelling) LockCycle(ctx context.Context, _ int, _ string, _ []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ops++; c.ops == c.after {
		c.cancel()
	}
	return ctx.Err()
}

// TestInterruptedRunIsNoResult interrupts the measured phase: the run is
// not a figure (its throughput would be that of a cut-short run reported
// as the whole --duration), and a comparison whose last run is interrupted
// is an error, not a table.
func TestInterruptedRunIsNoResult(t *testing.T) {
	newDriver := func() (*cancelling, context.Context) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		// The first operation and some of the measured ones complete.
		return &cancelling{fake: fake{name: "a", log: &callLog{}}, after: 20, cancel: cancel}, ctx
	}
	d, ctx := newDriver()
	res, err := Run(ctx, d, Options{Workload: Lock, Clients: 2, Duration: time.Minute})
	if err == nil {
		t.Fatalf("interrupted run: no error, result %d ops in %v (%.0f ops/s)", res.Ops, res.Elapsed, res.OpsPerSec)
	}
	d, ctx = newDriver()
	c, err := Compare(ctx, []System{{Driver: d}}, []PlanRow{{Lock, 2}}, 1, Options{Duration: time.Minute}, nil)
	if err == nil {
		t.Fatalf("interrupted comparison: no error, rows %+v", c.Rows)
	}
}

// TestLeaderIsNoneWhileTwoNodesClaimIt: a failover round must not kill a
// deposed leader that still reports leading (its kill would time nothing).
func TestLeaderIsNoneWhileTwoNodesClaimIt(t *testing.T) {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "bench test CA"})
	if err != nil {
		t.Fatal(err)
	}
	srvBundle, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: "node", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cliBundle, err := ca.Issue(auth.RoleClient, auth.IssueOptions{Name: "bench", Perms: []auth.Perm{{Namespace: "*", Write: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var leads [3]atomic.Bool
	leads[1].Store(true)
	leads[2].Store(true)
	c := &Cluster{Client: cliBundle}
	for i := range leads {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "raftlockd_raft_is_leader %d\n", map[bool]int{false: 0, true: 1}[leads[i].Load()])
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvBundle.TLSCertificate()}}
		srv.StartTLS()
		defer srv.Close()
		c.Nodes = append(c.Nodes, &Proc{Name: fmt.Sprint(i), API: srv.URL, cmd: &exec.Cmd{}})
	}
	if got := c.Leader(); got != -1 {
		t.Fatalf("two nodes claim to lead: Leader() = %d, want -1", got)
	}
	leads[1].Store(false)
	if got := c.Leader(); got != 2 {
		t.Fatalf("node 2 alone leads: Leader() = %d, want 2", got)
	}
}
