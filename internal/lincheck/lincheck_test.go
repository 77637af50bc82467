package lincheck

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Environment knobs of TestLinearizabilityUnderFaults.
const (
	envSchedules = "RAFTLOCKD_LIN_SCHEDULES" // how many schedules (default 20; 4 with -short)
	envSeed      = "RAFTLOCKD_LIN_SEED"      // run exactly the schedule with this seed
	envDuration  = "RAFTLOCKD_LIN_DURATION"  // fault phase of each schedule (default 4s, 3s under -race)
	envOut       = "RAFTLOCKD_LIN_OUT"       // where failing histories go (default $TMPDIR/raftlockd-lincheck)
)

// smallHistory: a porcupine timeout on a history this small is a failure;
// on a larger one it is only logged.
const smallHistory = 400

// schedule is one randomized run; everything random in it derives from seed.
type schedule struct {
	seed     int64
	clients  int
	keys     []string
	duration time.Duration
}

func newSchedule(t *testing.T, seed int64) schedule {
	r := rand.New(rand.NewSource(seed))
	s := schedule{seed: seed, clients: 4 + r.Intn(3), duration: 4 * time.Second}
	if raceEnabled {
		s.clients, s.duration = 4+r.Intn(2), 3*time.Second
	}
	if v := os.Getenv(envDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", envDuration, v, err)
		}
		s.duration = d
	}
	for i, n := 0, 2+r.Intn(2); i < n; i++ {
		s.keys = append(s.keys, fmt.Sprintf("lin/%x/k%d", uint64(seed)&0xffffff, i))
	}
	return s
}

func seeds(t *testing.T) []int64 {
	if v := os.Getenv(envSeed); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, v, err)
		}
		return []int64{seed}
	}
	n := 20
	if testing.Short() {
		n = 4
	}
	if v := os.Getenv(envSchedules); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envSchedules, v)
		}
	}
	base := time.Now().UnixNano()
	t.Logf("%d schedules from base seed %d", n, base)
	r := rand.New(rand.NewSource(base))
	out := make([]int64, n)
	for i := range out {
		out[i] = r.Int63()
	}
	return out
}

// TestLinearizabilityUnderFaults runs randomized fault schedules, each on a
// fresh three-node in-process cluster: concurrent clients drive the lease
// and state API while the nemesis partitions, stops and restarts nodes;
// afterwards the cluster heals, every node must converge to the same state
// and the history must be linearizable (porcupine, Model) with fencing
// tokens increasing in real-time order and no key ever held twice.
//
// RAFTLOCKD_LIN_SEED=<seed> reruns one schedule; RAFTLOCKD_LIN_SCHEDULES=200
// (with a larger -timeout) is the long mode (make lincheck).
func TestLinearizabilityUnderFaults(t *testing.T) {
	var total stats
	start := time.Now()
	for i, seed := range seeds(t) {
		t.Run(fmt.Sprintf("%02d/seed=%d", i, seed), func(t *testing.T) {
			total.add(runSchedule(t, newSchedule(t, seed)))
		})
	}
	t.Logf("all schedules: %s in %s", total, time.Since(start).Round(time.Millisecond))
}

type stats struct {
	schedules, ops, checked, ok, fail, unknown int
	check                                      time.Duration
}

func (s *stats) add(o stats) {
	s.schedules += o.schedules
	s.ops += o.ops
	s.checked += o.checked
	s.ok += o.ok
	s.fail += o.fail
	s.unknown += o.unknown
	s.check += o.check
}

func (s stats) String() string {
	return fmt.Sprintf("%d histories, %d ops (%d ok, %d failed, %d ambiguous), %d checked by porcupine in %s",
		s.schedules, s.ops, s.ok, s.fail, s.unknown, s.checked, s.check.Round(time.Millisecond))
}

func runSchedule(t *testing.T, s schedule) stats {
	t.Logf("seed %d: %d clients, keys %v, faults for %s (rerun: %s=%d)", s.seed, s.clients, s.keys, s.duration, envSeed, s.seed)
	c := testcluster.Start(t, 3)
	var endpoints, names []string
	for i, n := range c.Nodes {
		endpoints, names = append(endpoints, c.URL(i)), append(names, n.Name)
	}
	rec := NewRecorder()
	r := rand.New(rand.NewSource(s.seed))
	w := &Workload{Endpoints: endpoints, Names: names, Clients: s.clients, Keys: s.keys, TTL: 3 * time.Second,
		Block: time.Second, Seed: r.Int63(), Recorder: rec, Expire: 0.03}
	stop := make(chan struct{})
	wait := w.Start(stop)
	var once sync.Once
	finish := func() { once.Do(func() { close(stop); wait() }) }
	t.Cleanup(finish) // before the cluster stops, should the test end early

	nem := &Nemesis{Cluster: tcCluster{c}, Rand: rand.New(rand.NewSource(r.Int63())), Recorder: rec}
	nem.Run(s.duration)
	finish()
	rec.Note("clients done")
	if err := FinalReads(rec, endpoints, names, s.keys, s.clients, 20*time.Second); err != nil {
		t.Errorf("seed %d: %v", s.seed, err)
	}
	c.WaitConverged(20 * time.Second)

	ops, events := rec.Ops(), rec.Events()
	out := os.Getenv(envOut)
	if out == "" {
		out = filepath.Join(os.TempDir(), "raftlockd-lincheck")
	}
	res := Check(ops, events, CheckOptions{Timeout: 30 * time.Second, OutDir: out, Name: fmt.Sprintf("seed-%d", s.seed)})
	st := stats{schedules: 1, ops: len(ops), checked: res.Checked, check: res.Elapsed}
	for _, op := range ops {
		switch op.Output.Status {
		case StatusOK:
			st.ok++
		case StatusFail:
			st.fail++
		default:
			st.unknown++
		}
	}
	t.Logf("seed %d: %s; porcupine %s\n  outcomes: %s\n  nemesis: %s", s.seed, st, res.Porcupine, breakdown(ops), describeEvents(events))
	failed := !res.OK() || (res.Porcupine == porcupine.Unknown && res.Checked <= smallHistory)
	if res.Porcupine == porcupine.Unknown && !failed {
		t.Logf("seed %d: porcupine timed out on %d operations; not counted as a failure", s.seed, res.Checked)
	}
	if failed {
		t.Errorf("seed %d: history is not linearizable (porcupine: %s)\n  %s\n  visualization: %s\n  history: %s\n  rerun: %s=%d go test -run TestLinearizabilityUnderFaults ./internal/lincheck",
			s.seed, res.Porcupine, strings.Join(res.Violations, "\n  "), res.Visualization, res.HistoryFile, envSeed, s.seed)
	}
	return st
}

// breakdown counts outcomes by operation and code, with mean latency.
func breakdown(ops []Op) string {
	type agg struct {
		n   int
		lat time.Duration
	}
	m := map[string]*agg{}
	for _, op := range ops {
		k := op.Input.Kind.String() + " " + op.Output.Status.String()
		if op.Output.Code != "" {
			k += "/" + op.Output.Code
		}
		if m[k] == nil {
			m[k] = &agg{}
		}
		m[k].n++
		m[k].lat += time.Duration(op.Input.Return - op.Input.Call)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d (%s)", k, m[k].n, (m[k].lat/time.Duration(m[k].n)).Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

func describeEvents(events []Event) string {
	var parts []string
	for _, e := range events {
		parts = append(parts, secs(e.At)+" "+e.Desc)
	}
	return strings.Join(parts, ", ")
}

// tcCluster adapts the in-process test cluster to the nemesis.
type tcCluster struct{ c *testcluster.Cluster }

func (a tcCluster) Size() int                 { return len(a.c.Nodes) }
func (a tcCluster) Name(i int) string         { return a.c.Nodes[i].Name }
func (a tcCluster) Leader() int               { return a.c.Leader() }
func (a tcCluster) Stop(i int)                { a.c.Stop(i) }
func (a tcCluster) Start(i int)               { a.c.Start(i) }
func (a tcCluster) Partition(groups ...[]int) { a.c.Partition(groups...) }
func (a tcCluster) Heal()                     { a.c.Heal() }
func (a tcCluster) Slow(i int, d time.Duration) {
	for j := range a.c.Nodes {
		if j != i {
			a.c.Fabric.Delay(a.c.Nodes[i].Name, a.c.Nodes[j].Name, d)
		}
	}
}
