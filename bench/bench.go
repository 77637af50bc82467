// Package bench measures lock workloads against a lock service through a
// small Driver interface, so that raftlockd and its peers run the very same
// workload loop. It reports throughput and latency percentiles with the
// client count, as a table or as JSON.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"
)

// Workload names.
const (
	// Lock: each client acquires its own key, updates it with the payload
	// and releases it (committing the update).
	Lock = "lock"
	// Handoff: every client contends for ONE key; each cycle acquires
	// (waiting in line), then releases. Ops are hand-offs.
	Handoff = "handoff"
)

// Driver runs one operation of a workload against a system.
type Driver interface {
	// Name identifies the system under test.
	Name() string
	// LockCycle acquires key, writes payload under the lease and releases;
	// worker numbers the client running it.
	LockCycle(ctx context.Context, worker int, key string, payload []byte) error
	// Handoff acquires the shared key (waiting for it) and releases it.
	Handoff(ctx context.Context, worker int, key string) error
}

// Options describe a run.
type Options struct {
	Workload string
	Clients  int
	Duration time.Duration // measured time (ignored when Ops > 0)
	Ops      int           // total operations to measure; 0: run for Duration
	Warmup   time.Duration
	Payload  int // bytes written per lock cycle
}

// Result is one measured run.
type Result struct {
	System    string        `json:"system"`
	Workload  string        `json:"workload"`
	Clients   int           `json:"clients"`
	Ops       int64         `json:"ops"`
	Errors    int64         `json:"errors"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	OpsPerSec float64       `json:"ops_per_sec"`
	P50       time.Duration `json:"p50_ns"`
	P95       time.Duration `json:"p95_ns"`
	P99       time.Duration `json:"p99_ns"`
	Max       time.Duration `json:"max_ns"`
	FirstErr  string        `json:"first_error,omitempty"`
}

// Payload returns n bytes of valid JSON.
func Payload(n int) []byte {
	if n < 10 {
		n = 10
	}
	b := make([]byte, 0, n)
	b = append(b, `{"p":"`...)
	for len(b) < n-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
}

// Run executes one workload with opts.Clients concurrent clients.
func Run(ctx context.Context, d Driver, opts Options) (Result, error) {
	if opts.Clients <= 0 {
		return Result{}, fmt.Errorf("bench: clients must be positive")
	}
	payload := Payload(opts.Payload)
	// Each phase (first op, warm-up, measurement) uses its own keys, so an
	// operation cut short at the end of one phase cannot stall the next.
	var phase int64
	op := func(ctx context.Context, client, i int) error {
		switch opts.Workload {
		case Lock:
			return d.LockCycle(ctx, client, fmt.Sprintf("bench-%d-%d-%d", phase, client, i%64), payload)
		case Handoff:
			return d.Handoff(ctx, client, fmt.Sprintf("bench-handoff-%d", phase))
		}
		return fmt.Errorf("bench: unknown workload %q", opts.Workload)
	}
	next := func() { phase = time.Now().UnixNano() }
	next()
	if err := op(ctx, 0, 0); err != nil {
		return Result{}, fmt.Errorf("bench: first %s operation failed: %w", opts.Workload, err)
	}
	if opts.Warmup > 0 {
		next()
		wctx, cancel := context.WithTimeout(ctx, opts.Warmup)
		loop(wctx, opts.Clients, -1, op)
		cancel()
	}
	var rctx context.Context = ctx
	limit := int64(opts.Ops)
	if opts.Ops <= 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, opts.Duration)
		defer cancel()
		limit = -1
	}
	next()
	start := time.Now()
	samples, errs, first := loop(rctx, opts.Clients, limit, op)
	elapsed := time.Since(start)
	res := Result{System: d.Name(), Workload: opts.Workload, Clients: opts.Clients, Ops: int64(len(samples)),
		Errors: errs, Elapsed: elapsed}
	if first != nil {
		res.FirstErr = first.Error()
	}
	if len(samples) > 0 {
		slices.Sort(samples)
		res.OpsPerSec = float64(len(samples)) / elapsed.Seconds()
		pick := func(q float64) time.Duration { return samples[min(len(samples)-1, int(q*float64(len(samples))))] }
		res.P50, res.P95, res.P99, res.Max = pick(0.50), pick(0.95), pick(0.99), samples[len(samples)-1]
	}
	return res, nil
}

// loop runs op on clients goroutines until ctx ends or limit operations
// (shared budget, -1 unlimited) have completed.
func loop(ctx context.Context, clients int, limit int64, op func(context.Context, int, int) error) ([]time.Duration, int64, error) {
	var (
		mu      sync.Mutex
		all     []time.Duration
		errs    int64
		first   error
		started int64
		wg      sync.WaitGroup
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if limit >= 0 && started >= limit {
			return false
		}
		started++
		return true
	}
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			var mine []time.Duration
			var myErrs int64
			var myFirst error
			for i := 0; ctx.Err() == nil && take(); i++ {
				t := time.Now()
				err := op(ctx, c, i)
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					myErrs++
					if myFirst == nil {
						myFirst = err
					}
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			all = append(all, mine...)
			errs += myErrs
			if first == nil {
				first = myFirst
			}
			mu.Unlock()
		}(c)
	}
	wg.Wait()
	return all, errs, first
}

// WriteTable prints results as an aligned table.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tworkload\tclients\tops\terrors\tops/s\tp50\tp95\tp99\tmax\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t\n", r.System, r.Workload, r.Clients, r.Ops, r.Errors,
			r.OpsPerSec, ms(r.P50), ms(r.P95), ms(r.P99), ms(r.Max))
	}
	return tw.Flush()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// Report is everything one bench run measured.
type Report struct {
	Results   []Result        `json:"results"`
	Failovers []time.Duration `json:"failovers_ns,omitempty"`
}

// WriteJSON prints v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Summarize describes a set of durations: min, median and max.
func Summarize(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("min %s, median %s, max %s", ms(s[0]), ms(s[len(s)/2]), ms(s[len(s)-1]))
}
