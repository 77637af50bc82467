package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// PlanRow is one row of a comparison: a workload at a client count.
type PlanRow struct {
	Workload string `json:"workload"`
	Clients  int    `json:"clients"`
}

// ParsePlan reads rows written as workload=clients[,clients...], separated
// by spaces or semicolons: "lock=1,64 handoff=8".
func ParsePlan(s string) ([]PlanRow, error) {
	var out []PlanRow
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ';' || r == '\t' || r == '\n' }) {
		w, cs, ok := strings.Cut(item, "=")
		if !ok || w == "" || cs == "" {
			return nil, fmt.Errorf("bench: plan item %q: want workload=clients[,clients...]", item)
		}
		if !slices.Contains(Workloads, w) {
			return nil, fmt.Errorf("bench: plan item %q: unknown workload %q (want one of %s)", item, w, strings.Join(Workloads, ", "))
		}
		counts, err := ParseCounts(cs)
		if err != nil {
			return nil, fmt.Errorf("bench: plan item %q: %w", item, err)
		}
		for _, n := range counts {
			out = append(out, PlanRow{Workload: w, Clients: n})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: empty plan")
	}
	return out, nil
}

// ParseCounts reads comma-separated positive client counts.
func ParseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("client count %q: %w", f, err)
		}
		if n <= 0 {
			return nil, fmt.Errorf("client count %d: must be positive", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// CrossPlan runs every workload at every client count.
func CrossPlan(workloads []string, clients []int) []PlanRow {
	var out []PlanRow
	for _, w := range workloads {
		for _, n := range clients {
			out = append(out, PlanRow{Workload: w, Clients: n})
		}
	}
	return out
}

// Step is one run of a comparison: row Row of the plan, in round Round,
// against system System.
type Step struct {
	Row, Round, System int
}

// Schedule orders the runs of a comparison: round after round, every row,
// and for every row each system in turn (A B, A B, ...). A and B of a row
// run back to back, and a row's rounds lie a whole round apart, so that a
// machine whose speed drifts or hiccups shifts both systems alike and
// rarely all rounds of one row.
func Schedule(rows, rounds, systems int) []Step {
	var out []Step
	for r := 0; r < rounds; r++ {
		for row := 0; row < rows; row++ {
			for s := 0; s < systems; s++ {
				out = append(out, Step{Row: row, Round: r, System: s})
			}
		}
	}
	return out
}

// System is one system of a comparison.
type System struct {
	Driver Driver
	// Pids, when set, lists the system's server processes: the results
	// report the CPU time they used.
	Pids func() []int
	// Measure, when set, observes every measured phase (see
	// Options.Measure); o describes the run.
	Measure func(ctx context.Context, o Options) (end func(*Result))
	// Failover, when set, runs one leader-kill round (see
	// Cluster.FailoverRound).
	Failover func(ctx context.Context, round int) (time.Duration, error)
}

// Row is one row of a comparison: per system, the rounds' results and
// their combination.
type Row struct {
	PlanRow
	// Label names the workload in tables (default Workload).
	Label string `json:"label,omitempty"`
	// Results[s] combines the rounds of system s; Rounds[s] holds them.
	Results []Result   `json:"results"`
	Rounds  [][]Result `json:"rounds"`
	// Ratio is the first system's throughput over the second's, from the
	// combined results; RoundRatios the same for each round. NaN (null in
	// JSON) when the second system did nothing.
	Ratio       JSONFloat   `json:"ratio"`
	RoundRatios []JSONFloat `json:"round_ratios"`
}

// Name is the row's label, or its workload.
func (r Row) Name() string {
	if r.Label != "" {
		return r.Label
	}
	return r.Workload
}

// JSONFloat is a float64 that encodes NaN and infinities as null.
type JSONFloat float64

// MarshalJSON implements json.Marshaler.
func (f JSONFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return []byte(strconv.FormatFloat(v, 'f', 4, 64)), nil
}

// Comparison is what a side-by-side run measured.
type Comparison struct {
	Systems []string `json:"systems"`
	Rounds  int      `json:"rounds"`
	// Order lists the systems in the order each row ran them.
	Order     []string                   `json:"order"`
	Rows      []Row                      `json:"rows"`
	Failovers map[string][]time.Duration `json:"failovers_ns,omitempty"`
}

// ratio is a over b, NaN when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// Combine merges the results of several runs of one workload: operations,
// errors and elapsed time add up, percentiles come from all samples, CPU
// is averaged over the time.
func Combine(rs []Result) Result {
	if len(rs) == 0 {
		return Result{}
	}
	out := Result{System: rs[0].System, Workload: rs[0].Workload, Clients: rs[0].Clients}
	var samples []time.Duration
	var srv, cli float64
	for _, r := range rs {
		out.Errors += r.Errors
		out.Elapsed += r.Elapsed
		samples = append(samples, r.Samples...)
		srv += r.ServerCPU * r.Elapsed.Seconds()
		cli += r.ClientCPU * r.Elapsed.Seconds()
		if out.FirstErr == "" {
			out.FirstErr = r.FirstErr
		}
		if out.Raft == nil {
			out.Raft = r.Raft
		}
	}
	if s := out.Elapsed.Seconds(); s > 0 {
		out.ServerCPU, out.ClientCPU = srv/s, cli/s
	}
	out.summarize(samples)
	return out
}

// Compare runs every row of plan rounds times against every system, in
// the order of Schedule, and combines the rounds. A run that cannot start
// (its first operation fails) is recorded with its error and no
// operations. progress, when set, is told of every finished run.
func Compare(ctx context.Context, systems []System, plan []PlanRow, rounds int, opts Options,
	progress func(Step, Result)) (*Comparison, error) {
	if len(systems) == 0 || len(plan) == 0 || rounds <= 0 {
		return nil, fmt.Errorf("bench: a comparison needs systems, rows and rounds")
	}
	c := &Comparison{Rounds: rounds}
	for _, s := range systems {
		c.Systems = append(c.Systems, s.Driver.Name())
		c.Order = append(c.Order, s.Driver.Name())
	}
	for _, p := range plan {
		c.Rows = append(c.Rows, Row{PlanRow: p, Rounds: make([][]Result, len(systems))})
	}
	for _, st := range Schedule(len(plan), rounds, len(systems)) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sys, row := systems[st.System], &c.Rows[st.Row]
		o := opts
		o.Workload, o.Clients = row.Workload, row.Clients
		o.Measure = meter(sys, o)
		res, err := Run(ctx, sys.Driver, o)
		if cerr := ctx.Err(); cerr != nil {
			// Interrupted: what was measured so far is not a comparison.
			return nil, cerr
		}
		if err != nil {
			res = Result{System: sys.Driver.Name(), Workload: row.Workload, Clients: row.Clients, FirstErr: err.Error()}
		}
		row.Rounds[st.System] = append(row.Rounds[st.System], res)
		if progress != nil {
			progress(st, res)
		}
	}
	for i := range c.Rows {
		c.Rows[i].finish()
	}
	return c, nil
}

// finish combines the rounds and computes the ratios.
func (r *Row) finish() {
	r.Results = nil
	for _, rs := range r.Rounds {
		r.Results = append(r.Results, Combine(rs))
	}
	r.Ratio, r.RoundRatios = JSONFloat(math.NaN()), nil
	if len(r.Results) < 2 {
		return
	}
	r.Ratio = JSONFloat(ratio(r.Results[0].OpsPerSec, r.Results[1].OpsPerSec))
	for i := range min(len(r.Rounds[0]), len(r.Rounds[1])) {
		r.RoundRatios = append(r.RoundRatios, JSONFloat(ratio(r.Rounds[0][i].OpsPerSec, r.Rounds[1][i].OpsPerSec)))
	}
}

// meter measures the CPU time of sys's processes and of this process over
// a measured phase, and chains sys.Measure.
func meter(sys System, o Options) func(context.Context) func(*Result) {
	return func(ctx context.Context) func(*Result) {
		var procs []int
		if sys.Pids != nil {
			procs = sys.Pids()
		}
		var more func(*Result)
		if sys.Measure != nil {
			more = sys.Measure(ctx, o)
		}
		srv0, cli0 := cpuOf(procs), selfCPU()
		return func(res *Result) {
			if s := res.Elapsed.Seconds(); s > 0 {
				if len(procs) > 0 {
					res.ServerCPU = (cpuOf(procs) - srv0).Seconds() / s
				}
				res.ClientCPU = (selfCPU() - cli0).Seconds() / s
			}
			if more != nil {
				more(res)
			}
		}
	}
}

// CompareFailover runs rounds leader-kill rounds against every system that
// has a Failover, alternating between them round by round.
func CompareFailover(ctx context.Context, systems []System, rounds int) (map[string][]time.Duration, error) {
	out := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, s := range systems {
			if s.Failover == nil {
				continue
			}
			d, err := s.Failover(ctx, r)
			if err != nil {
				return out, fmt.Errorf("bench: %s failover round %d: %w", s.Driver.Name(), r+1, err)
			}
			out[s.Driver.Name()] = append(out[s.Driver.Name()], d)
		}
	}
	return out, nil
}

// FormatRatio prints a ratio as "3.2x" (two significant digits below 10).
func FormatRatio(f float64) string {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return "n/a"
	case f >= 10:
		return fmt.Sprintf("%.0fx", f)
	case f >= 1:
		return fmt.Sprintf("%.1fx", f)
	default:
		return fmt.Sprintf("%.2fx", f)
	}
}

func formatRatios(fs []JSONFloat) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, FormatRatio(float64(f)))
	}
	return strings.Join(parts, " ")
}

// cpu prints server+client CPU in cores ("1.35+0.40"), "-" when unknown.
func cpu(r Result) string {
	if r.ServerCPU == 0 && r.ClientCPU == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f+%.2f", r.ServerCPU, r.ClientCPU)
}

// comparisonCells are the cells of one row of a two-system comparison.
func comparisonCells(r Row) []string {
	a, b := r.Results[0], r.Results[1]
	return []string{r.Name(), strconv.Itoa(r.Clients),
		fmt.Sprintf("%.0f", a.OpsPerSec), fmt.Sprintf("%.0f", b.OpsPerSec),
		FormatRatio(float64(r.Ratio)), formatRatios(r.RoundRatios),
		latency(a, a.P50) + " / " + latency(a, a.P99), latency(b, b.P50) + " / " + latency(b, b.P99),
		fmt.Sprintf("%d / %d", a.Errors, b.Errors), cpu(a), cpu(b)}
}

func comparisonHeader(c *Comparison) []string {
	a, b := c.Systems[0], c.Systems[1]
	return []string{"workload", "clients", a + " ops/s", b + " ops/s", "ratio", "ratio per round",
		a + " p50 / p99", b + " p50 / p99", "errors", a + " CPU", b + " CPU"}
}

// WriteComparison prints a two-system comparison as an aligned table, one
// row per workload and client count with the ratio (first system over
// second) of the combined rounds and of each round.
func WriteComparison(w io.Writer, c *Comparison) error {
	if len(c.Systems) != 2 {
		return fmt.Errorf("bench: a comparison table takes two systems, not %d", len(c.Systems))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(comparisonHeader(c), "\t")+"\t")
	for _, r := range c.Rows {
		fmt.Fprintln(tw, strings.Join(comparisonCells(r), "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeFirstErrors(w, c)
	writeFailovers(w, c, "")
	return nil
}

// WriteComparisonMarkdown prints a two-system comparison as a Markdown
// table, with the failover times below it.
func WriteComparisonMarkdown(w io.Writer, c *Comparison) error {
	if len(c.Systems) != 2 {
		return fmt.Errorf("bench: a comparison table takes two systems, not %d", len(c.Systems))
	}
	head := comparisonHeader(c)
	fmt.Fprintf(w, "| %s |\n", strings.Join(head, " | "))
	align := make([]string, len(head))
	for i := range align {
		align[i] = "---:"
	}
	align[0] = "---"
	fmt.Fprintf(w, "|%s|\n", strings.Join(align, "|"))
	for _, r := range c.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(comparisonCells(r), " | "))
	}
	fmt.Fprintln(w)
	writeFirstErrors(w, c)
	writeFailovers(w, c, "- ")
	return nil
}

func writeFirstErrors(w io.Writer, c *Comparison) {
	for _, r := range c.Rows {
		for _, res := range r.Results {
			if res.FirstErr != "" {
				fmt.Fprintf(w, "first error of %s %s x%d: %s\n", res.System, r.Name(), r.Clients, res.FirstErr)
			}
		}
	}
}

func writeFailovers(w io.Writer, c *Comparison, bullet string) {
	for _, s := range c.Systems {
		if ds := c.Failovers[s]; len(ds) > 0 {
			fmt.Fprintf(w, "%sfailover of %s (leader SIGKILL -> first acknowledged write), %d rounds: %s\n",
				bullet, s, len(ds), Summarize(ds))
		}
	}
}
