package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParsePlan(t *testing.T) {
	got, err := ParsePlan("lock=1,64 handoff=8;public-read=4\tput=2 utxo-spend=1,64 utxo-create=8")
	if err != nil {
		t.Fatal(err)
	}
	want := []PlanRow{{Lock, 1}, {Lock, 64}, {Handoff, 8}, {PublicRead, 4}, {Put, 2}, {UTXOSpend, 1}, {UTXOSpend, 64}, {UTXOCreate, 8}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "lock", "lock=", "nope=1", "lock=0", "lock=x", "=1"} {
		if _, err := ParsePlan(bad); err == nil {
			t.Errorf("ParsePlan(%q) accepted", bad)
		}
	}
}

func TestCrossPlan(t *testing.T) {
	got := CrossPlan([]string{Lock, Handoff}, []int{1, 8})
	want := []PlanRow{{Lock, 1}, {Lock, 8}, {Handoff, 1}, {Handoff, 8}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestScheduleAlternates(t *testing.T) {
	got := Schedule(2, 2, 2)
	want := []Step{
		{Row: 0, Round: 0, System: 0}, {Row: 0, Round: 0, System: 1},
		{Row: 1, Round: 0, System: 0}, {Row: 1, Round: 0, System: 1},
		{Row: 0, Round: 1, System: 0}, {Row: 0, Round: 1, System: 1},
		{Row: 1, Round: 1, System: 0}, {Row: 1, Round: 1, System: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if n := len(Schedule(3, 1, 1)); n != 3 {
		t.Fatalf("one system, one round: %d steps, want 3", n)
	}
}

// fake is a Driver of every workload that logs which system ran when.
type fake struct {
	name  string
	delay time.Duration
	log   *callLog
	fail  bool
}

type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.calls); n == 0 || l.calls[n-1] != s {
		l.calls = append(l.calls, s)
	}
}

func (f *fake) op(workload string) error {
	f.log.add(f.name + ":" + workload)
	time.Sleep(f.delay)
	if f.fail {
		return errors.New("refused")
	}
	return nil
}

func (f *fake) Name() string { return f.name }
func (f *fake) LockCycle(context.Context, int, string, []byte) error {
	return f.op(Lock)
}
func (f *fake) Handoff(context.Context, int, string) error { return f.op(Handoff) }
func (f *fake) Seed(context.Context, string, []byte) error { return nil }
func (f *fake) PublicRead(context.Context, int, string) error {
	return f.op(PublicRead)
}

func TestCompareRunsSystemsAlternately(t *testing.T) {
	log := &callLog{}
	a := &fake{name: "a", delay: time.Millisecond, log: log}
	b := &fake{name: "b", delay: 2 * time.Millisecond, log: log}
	var failovers []string
	sys := func(d *fake) System {
		return System{Driver: d, Failover: func(_ context.Context, r int) (time.Duration, error) {
			failovers = append(failovers, d.name)
			return time.Duration(r+1) * time.Second, nil
		}}
	}
	systems := []System{sys(a), sys(b)}
	plan := []PlanRow{{Lock, 1}, {PublicRead, 2}}
	var steps []Step
	c, err := Compare(context.Background(), systems, plan, 2, Options{Ops: 20}, func(st Step, _ Result) { steps = append(steps, st) })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a:lock", "b:lock", "a:public-read", "b:public-read", "a:lock", "b:lock", "a:public-read", "b:public-read"}
	if !reflect.DeepEqual(log.calls, want) {
		t.Fatalf("order %v, want %v", log.calls, want)
	}
	if !reflect.DeepEqual(steps, Schedule(2, 2, 2)) {
		t.Fatalf("progress %v", steps)
	}
	if !reflect.DeepEqual(c.Systems, []string{"a", "b"}) || c.Rounds != 2 || len(c.Rows) != 2 {
		t.Fatalf("comparison %+v", c)
	}
	for _, r := range c.Rows {
		if len(r.Rounds[0]) != 2 || len(r.Rounds[1]) != 2 || r.Results[0].Ops != 40 || r.Results[1].Ops != 40 {
			t.Fatalf("row %s: rounds %d/%d, ops %d/%d", r.Workload, len(r.Rounds[0]), len(r.Rounds[1]), r.Results[0].Ops, r.Results[1].Ops)
		}
		// a is about twice as fast as b.
		if f := float64(r.Ratio); f < 1.2 || f > 4 {
			t.Errorf("row %s: ratio %.2f, want about 2", r.Workload, f)
		}
		if len(r.RoundRatios) != 2 {
			t.Errorf("row %s: %d round ratios", r.Workload, len(r.RoundRatios))
		}
		if r.Results[0].ClientCPU < 0 || r.Results[0].ServerCPU != 0 {
			t.Errorf("row %s: cpu %v/%v", r.Workload, r.Results[0].ServerCPU, r.Results[0].ClientCPU)
		}
	}
	fo, err := CompareFailover(context.Background(), systems, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(failovers, []string{"a", "b", "a", "b"}) || len(fo["a"]) != 2 || fo["b"][1] != 2*time.Second {
		t.Fatalf("failover order %v, times %v", failovers, fo)
	}
}

func TestCompareRecordsARunThatCannotStart(t *testing.T) {
	log := &callLog{}
	systems := []System{{Driver: &fake{name: "a", log: log}}, {Driver: &fake{name: "b", log: log, fail: true}}}
	c, err := Compare(context.Background(), systems, []PlanRow{{Lock, 1}, {Queue, 1}}, 1, Options{Ops: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lock, queue := c.Rows[0], c.Rows[1]
	if lock.Results[0].Ops != 3 || lock.Results[1].Ops != 0 || !strings.Contains(lock.Results[1].FirstErr, "refused") {
		t.Fatalf("lock row %+v", lock.Results)
	}
	if !math.IsNaN(float64(lock.Ratio)) {
		t.Fatalf("ratio over nothing: %v", lock.Ratio)
	}
	if !strings.Contains(queue.Results[0].FirstErr, "does not run queue") {
		t.Fatalf("queue row %+v", queue.Results[0])
	}
	var buf bytes.Buffer
	if err := WriteComparison(&buf, c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "n/a") || !strings.Contains(buf.String(), "first error of b lock x1") {
		t.Fatalf("table:\n%s", buf.String())
	}
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"ratio":null`) {
		t.Fatalf("JSON: %s", raw)
	}
}

func TestCombine(t *testing.T) {
	ms := time.Millisecond
	r1 := Result{System: "s", Workload: Lock, Clients: 2, Elapsed: time.Second, Errors: 1, ServerCPU: 1, ClientCPU: 0.5}
	r1.summarize([]time.Duration{1 * ms, 2 * ms, 3 * ms})
	r2 := Result{System: "s", Workload: Lock, Clients: 2, Elapsed: 3 * time.Second, FirstErr: "boom", ServerCPU: 2}
	r2.summarize([]time.Duration{4 * ms, 5 * ms, 6 * ms, 7 * ms, 8 * ms})
	c := Combine([]Result{r1, r2})
	if c.Ops != 8 || c.Errors != 1 || c.Elapsed != 4*time.Second || c.OpsPerSec != 2 || c.FirstErr != "boom" {
		t.Fatalf("combined %+v", c)
	}
	if c.P50 != 4*ms+500*time.Microsecond || c.Max != 8*ms || c.P99 != 7*ms+930*time.Microsecond {
		t.Fatalf("percentiles p50 %v p99 %v max %v", c.P50, c.P99, c.Max)
	}
	if c.ServerCPU != 1.75 || c.ClientCPU != 0.125 {
		t.Fatalf("cpu %v + %v", c.ServerCPU, c.ClientCPU)
	}
	if got := Combine(nil); got.Ops != 0 {
		t.Fatalf("empty: %+v", got)
	}
}

func TestFormatRatio(t *testing.T) {
	for f, want := range map[float64]string{0.254: "0.25x", 1: "1.0x", 3.26: "3.3x", 27.4: "27x", math.NaN(): "n/a", math.Inf(1): "n/a"} {
		if got := FormatRatio(f); got != want {
			t.Errorf("FormatRatio(%v) = %q, want %q", f, got, want)
		}
	}
}

// comparison builds a two-system comparison from throughputs and p50s.
func comparison(rows map[PlanRow][2]float64, p50 time.Duration) *Comparison {
	c := &Comparison{Systems: []string{"raftlockd", "etcd"}, Rounds: 1}
	for _, p := range []PlanRow{{Lock, 1}, {Lock, 64}, {Handoff, 8}, {Put, 64}} {
		v, ok := rows[p]
		if !ok {
			continue
		}
		row := Row{PlanRow: p, Rounds: make([][]Result, 2)}
		for s := range 2 {
			res := Result{System: c.Systems[s], Workload: p.Workload, Clients: p.Clients, Elapsed: time.Second}
			res.summarize(make([]time.Duration, int(v[s])))
			for i := range res.Samples {
				res.Samples[i] = p50
			}
			res.summarize(res.Samples)
			row.Rounds[s] = []Result{res}
		}
		row.finish()
		c.Rows = append(c.Rows, row)
	}
	return c
}

func TestComparisonMarkdown(t *testing.T) {
	c := comparison(map[PlanRow][2]float64{{Lock, 1}: {200, 400}, {Handoff, 8}: {3000, 100}}, time.Millisecond)
	c.Rows[0].Label = "lock-label"
	c.Failovers = map[string][]time.Duration{"raftlockd": {500 * time.Millisecond}, "etcd": {2 * time.Second}}
	var buf bytes.Buffer
	if err := WriteComparisonMarkdown(&buf, c); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"| workload | clients | raftlockd ops/s | etcd ops/s | ratio | ratio per round |",
		"| lock-label | 1 | 200 | 400 | 0.50x | 0.50x | 1.00ms / 1.00ms | 1.00ms / 1.00ms | 0 / 0 | - | - |",
		"| handoff | 8 | 3000 | 100 | 30x | 30x |",
		"- failover of raftlockd (leader SIGKILL -> first acknowledged write), 1 rounds: min 500.00ms",
		"- failover of etcd",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	if err := WriteComparisonMarkdown(&buf, &Comparison{Systems: []string{"one"}}); err == nil {
		t.Error("one system accepted")
	}
}

func TestGoals(t *testing.T) {
	c := comparison(map[PlanRow][2]float64{
		{Lock, 1}: {300, 400}, {Lock, 64}: {2400, 700}, {Handoff, 8}: {1000, 80}, {Put, 64}: {5000, 6000},
	}, time.Millisecond)
	c.Failovers = map[string][]time.Duration{"raftlockd": {400 * time.Millisecond, 1200 * time.Millisecond}, "etcd": {2 * time.Second}}
	goals := Goals(c)
	if len(goals) != 4 {
		t.Fatalf("%d goals", len(goals))
	}
	met := map[string]bool{}
	for _, g := range goals {
		if g.Measured == "" {
			t.Fatalf("goal %q not measured", g.Name)
		}
		met[g.Profile] = g.Met
	}
	// hand-off 12.5x < 25x; lock 64 3.4x >= 3x; p50 1ms < 1.5ms; a failover round took 1.2s.
	if met["handoff-8"] || !met["lock-64"] || !met["lock-1"] || goals[3].Met {
		t.Fatalf("verdicts %+v", goals)
	}
	var buf bytes.Buffer
	WriteMissed(&buf, goals)
	if got := buf.String(); got != "handoff-8\tcontended hand-offs/s, 8 contenders on one key\n-\tfailover: leader SIGKILL -> first acknowledged write\n" {
		t.Fatalf("missed:\n%q", got)
	}
	buf.Reset()
	WriteGoalsMarkdown(&buf, goals)
	if !strings.Contains(buf.String(), "| lock cycles/s, 64 clients | >= 3x etcd | 2400 vs 700 ops/s: 3.4x | met |") {
		t.Fatalf("goals:\n%s", buf.String())
	}
	buf.Reset()
	WriteReferenceMarkdown(&buf, c)
	if !strings.Contains(buf.String(), "| plain puts, 64 clients | ~6,900/s | 6000/s |") {
		t.Fatalf("reference:\n%s", buf.String())
	}

	none := Goals(&Comparison{Systems: []string{"raftlockd", "etcd"}})
	for _, g := range none {
		if g.Measured != "" || g.Met {
			t.Fatalf("goal without data: %+v", g)
		}
	}
	buf.Reset()
	WriteMissed(&buf, none)
	if buf.Len() != 0 {
		t.Fatalf("unmeasured goals reported missed: %q", buf.String())
	}
}

func TestParseMetricsAndRaftStats(t *testing.T) {
	before, err := ParseMetrics(strings.NewReader(`# HELP raftlockd_raft_propose_seconds x
# TYPE raftlockd_raft_propose_seconds histogram
raftlockd_raft_propose_seconds_bucket{le="0.0001"} 0
raftlockd_raft_propose_seconds_sum 1
raftlockd_raft_propose_seconds_count 100
raftlockd_raft_log_store_seconds_sum 0.5
raftlockd_raft_log_store_seconds_count 50
raftlockd_raft_apply_batch_entries_sum 100
raftlockd_raft_apply_batch_entries_count 100
raftlockd_raft_entry_commands_sum 100
raftlockd_raft_entry_commands_count 100
raftlockd_http_requests_total{code="200",endpoint="/v1/acquire"} 7 1700000000000
`))
	if err != nil {
		t.Fatal(err)
	}
	if before[`raftlockd_http_requests_total{code="200",endpoint="/v1/acquire"}`] != 7 ||
		before[`raftlockd_raft_propose_seconds_bucket{le="0.0001"}`] != 0 || before["raftlockd_raft_propose_seconds_count"] != 100 {
		t.Fatalf("parsed %v", before)
	}
	after := Samples{}
	for k, v := range before {
		after[k] = v
	}
	// 300 more proposals taking 0.9s, in 100 appends taking 0.2s, applied in 150 batches.
	after["raftlockd_raft_propose_seconds_sum"] += 0.9
	after["raftlockd_raft_propose_seconds_count"] += 300
	after["raftlockd_raft_log_store_seconds_sum"] += 0.2
	after["raftlockd_raft_log_store_seconds_count"] += 100
	after["raftlockd_raft_apply_batch_entries_sum"] += 300
	after["raftlockd_raft_apply_batch_entries_count"] += 150
	after["raftlockd_raft_entry_commands_sum"] += 300 // packed into 120 entries
	after["raftlockd_raft_entry_commands_count"] += 120
	s := RaftStatsBetween(before, after, 100)
	want := &RaftStats{ProposalsPerOp: 3, ProposeMean: 3 * time.Millisecond, LogStoreMean: 2 * time.Millisecond,
		EntriesPerStore: 3, CommandsPerEntry: 2.5, ApplyBatch: 2}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	if !strings.Contains(s.String(), "3.00 Raft proposals per op") || !strings.Contains(s.String(), "2.5 commands per entry") {
		t.Fatalf("String: %s", s)
	}
	if RaftStatsBetween(before, before, 10) != nil {
		t.Fatal("stats without proposals")
	}
}

func TestParseProcStat(t *testing.T) {
	line := "4242 (raft lockd (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 12 0 100 0 0\n"
	d, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if d != 3800*time.Millisecond {
		t.Fatalf("cpu %v, want 3.8s", d)
	}
	if _, err := parseProcStat("4242 (x) S 1"); err == nil {
		t.Fatal("short line accepted")
	}
	if selfCPU() <= 0 {
		t.Fatal("no CPU time for this process")
	}
}

func TestPayloadIsJSON(t *testing.T) {
	for _, n := range []int{0, 10, 256} {
		p := Payload(n)
		if !json.Valid(p) || (n >= 10 && len(p) != n) {
			t.Errorf("Payload(%d) = %q", n, p)
		}
	}
}

func TestExplain(t *testing.T) {
	res := Result{Workload: Lock, ServerCPU: 1.4, ClientCPU: 0.2, P50: 9 * time.Millisecond, OpsPerSec: 800}
	got := Explain(res, 2)
	if !strings.HasPrefix(got, "CPU per operation: 1.75ms in the servers, 0.25ms in the bench client. 1.60 of 2 cores were busy") ||
		!strings.Contains(got, "(nearly) saturated") || !strings.HasSuffix(got, "in sequence.") {
		t.Fatalf("saturated: %s", got)
	}
	res.ServerCPU = 0.5
	res.Raft = &RaftStats{ProposalsPerOp: 3, ProposeMean: 2 * time.Millisecond, LogStoreMean: time.Millisecond, EntriesPerStore: 1}
	got = Explain(res, 2)
	if !strings.Contains(got, "0.70 of 2 cores were busy (servers 0.50, bench client 0.20): the processor is not the limit.") ||
		!strings.Contains(got, "3.0 Raft commands in sequence, 2.00ms each") || !strings.HasSuffix(got, "about 6.00ms of the 9.00ms p50.") {
		t.Fatalf("idle: %s", got)
	}
	res.Raft.EntriesPerStore = 8
	if got := Explain(res, 2); !strings.Contains(got, "8.0 commands per fsync") {
		t.Fatalf("batched: %s", got)
	}
	res.Workload, res.OpsPerSec = Handoff, 400
	if got := Explain(res, 2); !strings.Contains(got, "at most 500 hand-offs/s; 400/s (2.50ms per hand-off) were measured") {
		t.Fatalf("handoff: %s", got)
	}
	if got := Explain(Result{Workload: Lock}, 2); !strings.HasPrefix(got, "0.00 of 2 cores were busy") {
		t.Fatalf("nothing known: %s", got)
	}
}

func TestFirstAck(t *testing.T) {
	const up = 50 * time.Millisecond
	for name, write := range map[string]func(time.Time) func(context.Context, int) error{
		// Writes sent before a leader exists are dropped and time out.
		"dropped": func(start time.Time) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				if time.Since(start) < up {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}
		},
		// Writes sent before a leader exists wait for it.
		"waiting": func(start time.Time) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				time.Sleep(time.Until(start.Add(up)))
				return nil
			}
		},
	} {
		start := time.Now()
		d, err := firstAck(context.Background(), start, write(start))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d < up || d > up+5*failoverEvery {
			t.Errorf("%s: first ack after %v, want about %v", name, d, up)
		}
		if time.Since(start) > time.Second {
			t.Errorf("%s: returned after %v: the dropped attempts were not cancelled", name, time.Since(start))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := firstAck(ctx, time.Now(), func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }); err == nil {
		t.Fatal("cancelled context: no error")
	}
}

// TestFailoverIsTimedFromTheSignal kills a real process the way a failover
// round kills the leader: the time runs from the SIGKILL, not from the
// moment the process was seen to end.
func TestFailoverIsTimedFromTheSignal(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep binary")
	}
	p := &Proc{Name: "leader", args: []string{"60"}}
	if err := p.start("sleep", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	var killing, acked time.Time
	took, err := afterKill(context.Background(), func() { killing = time.Now(); p.kill() },
		func(context.Context, int) error { acked = time.Now(); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if p.cmd != nil {
		t.Fatal("the process was not killed")
	}
	if min := acked.Sub(killing); took < min {
		t.Fatalf("failover of %v, but the write was acknowledged %v after the kill began", took, min)
	}
}
