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

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
)

// TestMain fails the package when goroutines outlive its tests. memberlist's
// last probe of a crashed or frozen peer outlives its Shutdown by up to its
// probe timeout, which grows (up to eightfold) while the node's view of its
// peers is poor, so goroutines get a few seconds to end by themselves.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); err = goleak.Find() {
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Environment knobs of TestLinearizabilityUnderFaults.
const (
	envSchedules = "RAFTLOCKD_LIN_SCHEDULES" // how many schedules (default 20; 4 with -short)
	envSeed      = "RAFTLOCKD_LIN_SEED"      // run exactly the schedule with this seed
	envDuration  = "RAFTLOCKD_LIN_DURATION"  // fault phase of each schedule (default 4s, 2.5s under -race)
	envOut       = "RAFTLOCKD_LIN_OUT"       // where failing histories go (default $TMPDIR/raftlockd-lincheck)
)

// smallHistory: a porcupine timeout on a history this small is a failure;
// on a larger one it is only logged. The readers' public gets (one reader
// per node) make up most of a history and cost porcupine little.
const smallHistory = 1500

// schedule is one randomized run; everything random in it derives from seed.
type schedule struct {
	seed     int64
	nodes    int
	clients  int
	keys     []string
	duration time.Duration
}

// fiveNodes reports whether seed's schedule runs five nodes rather than
// three: seeds whose two low bits are set do (every fourth of seeds).
func fiveNodes(seed int64) bool { return seed&3 == 3 }

func newSchedule(t *testing.T, seed int64) schedule {
	r := rand.New(rand.NewSource(seed))
	s := schedule{seed: seed, nodes: 3, clients: 4 + r.Intn(3), duration: 4 * time.Second}
	if raceEnabled {
		s.clients, s.duration = 4+r.Intn(2), 2500*time.Millisecond
	}
	if fiveNodes(seed) {
		s.nodes = 5
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
		// Every fourth schedule runs five nodes (see fiveNodes).
		out[i] = r.Int63()&^3 | int64(i%4)
	}
	return out
}

// TestLinearizabilityUnderFaults runs randomized fault schedules, each on a
// fresh in-process cluster of three nodes (five for every fourth schedule):
// concurrent clients drive the lease and state API while the nemesis
// partitions, freezes, crashes, stops and restarts nodes (up to two at once
// among five); afterwards the cluster heals, the history must be
// linearizable (porcupine, Model) with fencing tokens increasing in
// real-time order and no key ever held twice, and every node must converge
// to the same state.
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
	t.Logf("seed %d: %d nodes, %d clients, keys %v, faults for %s (rerun: %s=%d)", s.seed, s.nodes, s.clients, s.keys,
		s.duration, envSeed, s.seed)
	c := testcluster.Start(t, s.nodes)
	// The model is of this build's rules, which a new island follows only
	// about a second after it starts, once gossip shows that every node
	// applies them (before, an X-If-State-ETag of "" is no condition).
	c.WaitRules(20 * time.Second)
	var endpoints, names []string
	for i, n := range c.Nodes {
		endpoints, names = append(endpoints, c.URL(i)), append(names, n.Name)
	}
	rec := NewRecorder()
	r := rand.New(rand.NewSource(s.seed))
	w := &Workload{Endpoints: endpoints, Names: names, Clients: s.clients, Readers: s.nodes, Keys: s.keys, TTL: 3 * time.Second,
		Block: time.Second, Seed: r.Int63(), Recorder: rec, Expire: 0.03, Keep: 0.05, Dial: c.Fabric.Dialer("clients"),
		TLS: auth.ClientConfig(testutil.ClientBundleOf(t, c.CA()))}
	stop := make(chan struct{})
	wait := w.Start(stop)
	var once sync.Once
	finish := func() { once.Do(func() { close(stop); wait() }) }
	t.Cleanup(finish) // before the cluster stops, should the test end early

	nem := &Nemesis{Cluster: tcCluster{c}, Rand: rand.New(rand.NewSource(r.Int63())), Recorder: rec}
	nem.Run(s.duration)
	finish()
	rec.Note("clients done")
	// Failures here are reported after the history was checked and, since
	// they are failures, saved.
	var problems []string
	if err := w.Finish(30 * time.Second); err != nil {
		problems = append(problems, err.Error())
	}
	if err := c.Converged(20 * time.Second); err != nil {
		problems = append(problems, err.Error())
	}

	ops, events := rec.Ops(), rec.Events()
	out := os.Getenv(envOut)
	if out == "" {
		out = filepath.Join(os.TempDir(), "raftlockd-lincheck")
	}
	res := Check(ops, events, CheckOptions{Timeout: 30 * time.Second, SmallHistory: smallHistory, OutDir: out,
		Name: fmt.Sprintf("seed-%d", s.seed), Always: len(problems) > 0})
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
	if res.Porcupine == porcupine.Unknown && !res.Failed {
		t.Logf("seed %d: porcupine timed out on %d operations; not counted as a failure", s.seed, res.Checked)
	}
	rerun := fmt.Sprintf("%s=%d go test -run TestLinearizabilityUnderFaults ./internal/lincheck", envSeed, s.seed)
	if res.Failed {
		t.Errorf("seed %d: history is not linearizable (porcupine: %s)\n  %s\n  visualization: %s\n  history: %s\n  rerun: %s",
			s.seed, res.Porcupine, strings.Join(res.Violations, "\n  "), res.Visualization, res.HistoryFile, rerun)
	}
	if len(problems) > 0 {
		t.Errorf("seed %d: %s\n  visualization: %s\n  history: %s\n  rerun: %s", s.seed, strings.Join(problems, "\n  "),
			res.Visualization, res.HistoryFile, rerun)
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

func (a tcCluster) Size() int         { return len(a.c.Nodes) }
func (a tcCluster) Name(i int) string { return a.c.Nodes[i].Name }
func (a tcCluster) Leader() int       { return a.c.Leader() }
func (a tcCluster) Stop(i int)        { a.c.Stop(i) }
func (a tcCluster) Start(i int)       { a.c.Start(i) }
func (a tcCluster) Freeze(i int)      { a.c.Freeze(i) }
func (a tcCluster) Thaw(i int)        { a.c.Thaw(i) }
func (a tcCluster) Crash(i int, reboot bool) {
	if reboot {
		a.c.PowerOff(i)
	} else {
		a.c.Crash(i)
	}
}
func (a tcCluster) Partition(groups ...[]int) { a.c.Partition(groups...) }
func (a tcCluster) Heal()                     { a.c.Heal() }
func (a tcCluster) Slow(i int, d time.Duration) {
	for j := range a.c.Nodes {
		if j != i {
			a.c.Fabric.Delay(a.c.Nodes[i].Name, a.c.Nodes[j].Name, d)
		}
	}
}
