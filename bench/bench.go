// Package bench measures lock workloads against a lock service through a
// small Driver interface, so that raftlockd and its peers (etcd) run the
// very same workload loop. It reports throughput and latency percentiles
// with the client count, as a table or as JSON, and compares two systems
// measured alternately in one run (see Compare).
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
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
	// XACommit: each client commits a transaction over two keys (on one
	// island, or on two when the driver has two): acquire both in one
	// transaction, update both with the payload, commit.
	XACommit = "xa-commit"
	// Queue: each producer/consumer pair enqueues the payload to a queue of
	// its own, dequeues it and acknowledges it.
	Queue = "queue"
	// PublicRead: every client reads the committed value of one key,
	// written before the run, without holding a lock (linearizable read).
	PublicRead = "public-read"
	// Put: each client writes the payload to a key of its own, one
	// acknowledged replicated write per operation.
	Put = "put"
	// UTXOSpend: each client spends two unspent outputs (of two parent
	// transactions created before, unmeasured) as inputs 0 and 1 of a new
	// transaction, in one all-or-nothing spend.
	UTXOSpend = "utxo-spend"
	// UTXOCreate: each client creates a new transaction with two outputs.
	UTXOCreate = "utxo-create"
)

// Workloads lists every workload name.
var Workloads = []string{Lock, Handoff, XACommit, Queue, PublicRead, Put, UTXOSpend, UTXOCreate}

// ReadDriver is a Driver that also reads committed values without a lock.
type ReadDriver interface {
	Driver
	// Seed commits payload to key, so that reads find it.
	Seed(ctx context.Context, key string, payload []byte) error
	// PublicRead reads the committed value of key; a key without one is an
	// error.
	PublicRead(ctx context.Context, worker int, key string) error
}

// PutDriver is a Driver that also runs plain writes.
type PutDriver interface {
	Driver
	// Put writes payload to key and returns once the write is acknowledged.
	Put(ctx context.Context, worker int, key string, payload []byte) error
}

// PutPreparer is a PutDriver that needs something set up before it puts to
// a key (raftlockd: the lease its updates go under). Run prepares every
// client's key before the first operation, so that no measured put pays
// for it.
type PutPreparer interface {
	PutDriver
	PreparePut(ctx context.Context, worker int, key string) error
}

// Finisher is a Driver that holds something across the operations of a
// run (leases, for example) and gives it back when the run ends.
type Finisher interface {
	Finish(ctx context.Context) error
}

// QueueDriver is a Driver that also runs queue cycles.
type QueueDriver interface {
	Driver
	// QueueCycle enqueues payload to queue, dequeues it and acknowledges it.
	QueueCycle(ctx context.Context, worker int, queue string, payload []byte) error
}

// XADriver is a Driver that also runs two-key transactions.
type XADriver interface {
	Driver
	// XACommit commits payload to keys[0] and keys[1] in one transaction.
	XACommit(ctx context.Context, worker int, keys [2]string, payload []byte) error
}

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
	// ParentOutputs is the number of outputs of each parent transaction
	// utxo-spend creates to spend (default DefaultParentOutputs).
	ParentOutputs int
	// Measure, when set, is called as the measured phase starts; the
	// function it returns is called with the result as the phase ends, to
	// add what it observed (CPU time, server metrics).
	Measure func(ctx context.Context) (end func(*Result))
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
	// ServerCPU is the CPU time the system's server processes used during
	// the measurement, in cores (1.0: one core busy throughout); ClientCPU
	// the same for the bench process.
	ServerCPU float64 `json:"server_cpu_cores,omitempty"`
	ClientCPU float64 `json:"client_cpu_cores,omitempty"`
	// Raft is what the leader of a raftlockd cluster reported during the
	// measurement, when it was asked.
	Raft *RaftStats `json:"raft,omitempty"`
	// Samples are the latencies of the successful operations, unsorted.
	Samples []time.Duration `json:"-"`
}

// summarize fills the throughput and the percentiles from samples.
func (r *Result) summarize(samples []time.Duration) {
	r.Samples = samples
	r.Ops = int64(len(samples))
	r.OpsPerSec, r.P50, r.P95, r.P99, r.Max = 0, 0, 0, 0, 0
	if len(samples) == 0 {
		return
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	if r.Elapsed > 0 {
		r.OpsPerSec = float64(len(s)) / r.Elapsed.Seconds()
	}
	r.P50, r.P95, r.P99, r.Max = percentile(s, 0.50), percentile(s, 0.95), percentile(s, 0.99), s[len(s)-1]
}

// percentile is the q-quantile (0 <= q <= 1) of the sorted samples s,
// interpolated linearly between the two samples around rank q*(len(s)-1):
// the median of an even count lies halfway between the middle two, and
// p99 of 100 samples between the 99th and the largest. 0 without samples.
func percentile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[i] + time.Duration(math.Round((pos-float64(i))*float64(s[i+1]-s[i])))
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
	if !slices.Contains(Workloads, opts.Workload) {
		return Result{}, fmt.Errorf("bench: unknown workload %q", opts.Workload)
	}
	if !Supports(d, opts.Workload) {
		return Result{}, fmt.Errorf("bench: %s does not run %s", d.Name(), opts.Workload)
	}
	payload := Payload(opts.Payload)
	runID := time.Now().UnixNano()
	readKey := fmt.Sprintf("bench-read-%d", runID)
	// A put's key is the client's for the whole run (a put never waits for
	// it), so that what PreparePut set up serves every phase.
	putKey := func(client int) string { return fmt.Sprintf("bench-put-%d-%d", runID, client) }
	// utxo-spend spends outputs each client created before; prep creates
	// more, outside the measured latency, when a client has spent them all.
	var (
		pools *utxoPools
		prep  func(ctx context.Context, client int) error
	)
	if ud, ok := d.(UTXODriver); ok && opts.Workload == UTXOSpend {
		pools = newUTXOPools(ud, opts.Clients, opts.ParentOutputs)
		prep = pools.refill
	}
	// Each phase (first op, warm-up, measurement) uses its own keys, so an
	// operation cut short at the end of one phase cannot stall the next.
	var phase int64
	op := func(ctx context.Context, client, i int) error {
		switch opts.Workload {
		case Lock:
			return d.LockCycle(ctx, client, fmt.Sprintf("bench-%d-%d-%d", phase, client, i%64), payload)
		case Handoff:
			return d.Handoff(ctx, client, fmt.Sprintf("bench-handoff-%d", phase))
		case XACommit:
			xd, ok := d.(XADriver)
			if !ok {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), XACommit)
			}
			k := fmt.Sprintf("bench-xa-%d-%d-%d", phase, client, i%64)
			return xd.XACommit(ctx, client, [2]string{k + "-a", k + "-b"}, payload)
		case Queue:
			qd, ok := d.(QueueDriver)
			if !ok {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), Queue)
			}
			return qd.QueueCycle(ctx, client, fmt.Sprintf("bench-q-%d-%d", phase, client), payload)
		case PublicRead:
			rd, ok := d.(ReadDriver)
			if !ok {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), PublicRead)
			}
			return rd.PublicRead(ctx, client, readKey)
		case Put:
			pd, ok := d.(PutDriver)
			if !ok {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), Put)
			}
			return pd.Put(ctx, client, putKey(client), payload)
		case UTXOSpend:
			if pools == nil {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), UTXOSpend)
			}
			return pools.spend(ctx, client)
		case UTXOCreate:
			ud, ok := d.(UTXODriver)
			if !ok {
				return fmt.Errorf("bench: %s does not run %s", d.Name(), UTXOCreate)
			}
			txid := newTxID()
			return ud.UTXOCreate(ctx, client, txid, outputHashes(txid, 2))
		}
		return fmt.Errorf("bench: unknown workload %q", opts.Workload)
	}
	next := func() { phase = time.Now().UnixNano() }
	next()
	if f, ok := d.(Finisher); ok {
		defer func() { _ = f.Finish(context.WithoutCancel(ctx)) }()
	}
	if opts.Workload == PublicRead {
		if rd, ok := d.(ReadDriver); ok {
			if err := rd.Seed(ctx, readKey, payload); err != nil {
				return Result{}, fmt.Errorf("bench: write the key to read: %w", err)
			}
		}
	}
	if pp, ok := d.(PutPreparer); ok && opts.Workload == Put {
		if err := forClients(opts.Clients, func(c int) error { return pp.PreparePut(ctx, c, putKey(c)) }); err != nil {
			return Result{}, fmt.Errorf("bench: prepare the puts: %w", err)
		}
	}
	if pools != nil {
		if err := pools.fill(ctx); err != nil {
			return Result{}, fmt.Errorf("bench: create the outputs to spend: %w", err)
		}
	}
	if prep != nil {
		if err := prep(ctx, 0); err != nil {
			return Result{}, fmt.Errorf("bench: prepare the first %s operation: %w", opts.Workload, err)
		}
	}
	if err := op(ctx, 0, 0); err != nil {
		return Result{}, fmt.Errorf("bench: first %s operation failed: %w", opts.Workload, err)
	}
	if opts.Warmup > 0 {
		next()
		wctx, cancel := context.WithTimeout(ctx, opts.Warmup)
		loop(ctx, wctx, opts.Clients, -1, prep, op)
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
	var end func(*Result)
	if opts.Measure != nil {
		end = opts.Measure(ctx)
	}
	start := time.Now()
	samples, errs, first := loop(ctx, rctx, opts.Clients, limit, prep, op)
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		// Interrupted: the clients stopped before the measurement ended,
		// and the operations cut short were dropped; no figure holds.
		return Result{}, fmt.Errorf("bench: %s %s x%d interrupted: %w", d.Name(), opts.Workload, opts.Clients, err)
	}
	res := Result{System: d.Name(), Workload: opts.Workload, Clients: opts.Clients, Errors: errs, Elapsed: elapsed}
	if first != nil {
		res.FirstErr = first.Error()
	}
	res.summarize(samples)
	if end != nil {
		end(&res)
	}
	return res, nil
}

// forClients runs f for every client concurrently and returns the first
// error.
func forClients(clients int, f func(client int) error) error {
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c] = f(c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// loop runs op on clients goroutines until stop ends or limit operations
// (shared budget, -1 unlimited) have started. Operations run with ctx, not
// stop: the ones in flight when the measurement ends complete normally,
// instead of failing on a deadline the system under test was told of.
// prep, when set, runs before each operation outside its latency (its
// time still passes on the wall clock the throughput is measured with); a
// failed prep counts as a failed operation.
func loop(ctx, stop context.Context, clients int, limit int64, prep func(context.Context, int) error,
	op func(context.Context, int, int) error) ([]time.Duration, int64, error) {
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
			for i := 0; stop.Err() == nil && take(); i++ {
				var err error
				if prep != nil {
					err = prep(ctx, c)
				}
				t := time.Now()
				if err == nil {
					err = op(ctx, c, i)
				}
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
			r.OpsPerSec, latency(r, r.P50), latency(r, r.P95), latency(r, r.P99), latency(r, r.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		if r.FirstErr != "" {
			fmt.Fprintf(w, "first error of %s %s x%d: %s\n", r.System, r.Workload, r.Clients, r.FirstErr)
		}
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// latency prints a latency of r, "-" when r completed no operation.
func latency(r Result, d time.Duration) string {
	if r.Ops == 0 {
		return "-"
	}
	return ms(d)
}

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
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("min %s, median %s, max %s", ms(s[0]), ms(percentile(s, 0.5)), ms(s[len(s)-1]))
}
