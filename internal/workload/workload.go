// Package workload drives a running raftlockd cluster the way applications
// do while tests break it: writers commit transactions through any of the
// cluster's API endpoints (moving to the next endpoint when one fails), and
// afterwards Verify checks that every acknowledged commit is present,
// identically, on every node. It also reads the metrics tests use to find
// the leader and to wait until the nodes have applied the same log. The
// multi-process tests (cmd/raftlockd) and the Docker tests (e2e) share it.
package workload

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Config shapes a load.
type Config struct {
	// Endpoints are the API base URLs (https://host:port, or http:// with
	// mTLS disabled) of the nodes.
	Endpoints []string
	// TLS is what the writers dial https endpoints with: the client
	// certificate to present and the CA to check the nodes with.
	TLS     *tls.Config
	Writers int
	// Seed picks the first writer's endpoint; the others follow in turn.
	Seed int64
	// Prefix starts every key the load writes (default "wl").
	Prefix string
	// TTL of the writers' leases (whole seconds; default 3s).
	TTL time.Duration
	// Block is how long an acquire of a writer's own key may wait for a
	// lease an interrupted cycle left behind (default 10s).
	Block time.Duration
	// Retry is the client's retry budget (client.WithRetry; default 1s).
	Retry time.Duration
	// RequestTimeout bounds one HTTP request (default 5s); it must exceed
	// the servers' --leader-wait.
	RequestTimeout time.Duration
	// CycleTimeout bounds one acquire-update-release cycle (default 15s).
	CycleTimeout time.Duration
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = "wl"
	}
	if c.TTL <= 0 {
		c.TTL = 3 * time.Second
	}
	if c.Block <= 0 {
		c.Block = 10 * time.Second
	}
	if c.Retry <= 0 {
		c.Retry = time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.CycleTimeout <= 0 {
		c.CycleTimeout = 15 * time.Second
	}
}

// Doc is what writers commit.
type Doc struct {
	Writer int   `json:"writer"`
	N      int64 `json:"n"`
}

// Writer is what one writer knows. Every attempt n commits, in one
// transaction, Doc{writer, n} to the writer's own key (RollingKey) and to
// a key of its own (AttemptKey(n)). Only the writer's goroutine touches a
// Writer until Stop returns.
type Writer struct {
	ID            int
	LastAttempted int64          // attempts that may have staged a write
	LastAcked     int64          // highest acknowledged attempt
	Acked         map[int64]bool // acknowledged attempts
	MaxToken      int64          // highest fencing token of the rolling key
	Failures      int            // cycles that ended in an error
	Errors        map[string]int // failures by error, for the summary

	prefix  string
	lastAck atomic.Int64 // unix nanoseconds of the latest acknowledgement
}

// RollingKey is the key every commit of the writer overwrites.
func (w *Writer) RollingKey() string { return fmt.Sprintf("%s-w%d", w.prefix, w.ID) }

// AttemptKey is the key only attempt n writes.
func (w *Writer) AttemptKey(n int64) string { return fmt.Sprintf("%s-w%d/%d", w.prefix, w.ID, n) }

// Load is a set of running writers.
type Load struct {
	cfg        Config
	clients    []*client.Client
	transports []*http.Transport
	writers    []*Writer
	acks       atomic.Int64
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	mu         sync.Mutex
	violations []string
}

// Start launches the writers.
func Start(cfg Config) (*Load, error) {
	cfg.defaults()
	if len(cfg.Endpoints) == 0 || cfg.Writers <= 0 {
		return nil, errors.New("workload: need endpoints and writers")
	}
	l := &Load{cfg: cfg}
	for _, ep := range cfg.Endpoints {
		tr := &http.Transport{MaxIdleConnsPerHost: cfg.Writers, TLSClientConfig: cfg.TLS}
		c, err := client.New(ep, client.WithRetry(cfg.Retry),
			client.WithHTTPClient(&http.Client{Transport: tr, Timeout: cfg.RequestTimeout}))
		if err != nil {
			return nil, err
		}
		l.clients, l.transports = append(l.clients, c), append(l.transports, tr)
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	// Writers are spread evenly over the endpoints, starting at a random one.
	offset := rand.New(rand.NewSource(cfg.Seed)).Intn(len(cfg.Endpoints))
	for i := 0; i < cfg.Writers; i++ {
		w := &Writer{ID: i, Acked: map[int64]bool{}, Errors: map[string]int{}, prefix: cfg.Prefix}
		l.writers = append(l.writers, w)
		l.wg.Add(1)
		go l.run(w, (offset+i)%len(cfg.Endpoints))
	}
	return l, nil
}

func (l *Load) run(w *Writer, cur int) {
	defer l.wg.Done()
	for l.ctx.Err() == nil {
		if err := l.cycle(l.clients[cur], w); err != nil {
			if l.ctx.Err() != nil {
				return
			}
			w.Failures++
			w.Errors[errorClass(err)]++
			cur = (cur + 1) % len(l.clients) // try the next node
			select {
			case <-l.ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		w.lastAck.Store(time.Now().UnixNano())
		l.acks.Add(1)
	}
}

// cycle is one transaction: lease the rolling key, join the attempt's own
// key to the transaction, stage the document on both and commit.
func (l *Load) cycle(c *client.Client, w *Writer) error {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.CycleTimeout)
	defer cancel()
	ttl := max(int64(l.cfg.TTL/time.Second), 1)
	lease, err := c.Acquire(ctx, wire.AcquireRequest{Key: w.RollingKey(), Owner: fmt.Sprintf("writer-%d", w.ID),
		TTLSeconds: ttl, BlockSecs: max(int64(l.cfg.Block/time.Second), 1)})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	if lease.FencingToken <= w.MaxToken {
		l.violation("%s: fencing token %d after %d", w.RollingKey(), lease.FencingToken, w.MaxToken)
	}
	w.MaxToken = max(w.MaxToken, lease.FencingToken)
	abandon := func() {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		defer acancel()
		_ = lease.Release(actx, true) // best effort; the TTL frees the keys otherwise
	}
	w.LastAttempted++
	n := w.LastAttempted
	doc, _ := json.Marshal(Doc{Writer: w.ID, N: n})
	own, err := c.Acquire(ctx, wire.AcquireRequest{Key: w.AttemptKey(n), Owner: lease.Owner, TTLSeconds: ttl,
		BlockSecs: -1, TxnID: lease.TxnID})
	if err != nil {
		abandon()
		return fmt.Errorf("acquire attempt key: %w", err)
	}
	for _, ls := range []*client.Lease{lease, own} {
		if _, err := ls.Update(ctx, doc, client.Conditions{}); err != nil {
			abandon()
			return fmt.Errorf("update: %w", err)
		}
	}
	if err := lease.Release(ctx, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	w.LastAcked, w.Acked[n] = n, true
	return nil
}

func (l *Load) violation(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

// errorClass shortens an error for the failure summary.
func errorClass(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		op, _, _ := strings.Cut(err.Error(), ":")
		return op + ": " + ce.Envelope.Code
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		s, _, _ = strings.Cut(s, ":")
		return s + ": connection refused"
	case strings.Contains(s, "Client.Timeout") || strings.Contains(s, "deadline exceeded"):
		s, _, _ = strings.Cut(s, ":")
		return s + ": timeout"
	case strings.Contains(s, "EOF") || strings.Contains(s, "connection reset"):
		s, _, _ = strings.Cut(s, ":")
		return s + ": connection lost"
	}
	return s
}

// Acks is the number of acknowledged commits so far.
func (l *Load) Acks() int64 { return l.acks.Load() }

// WaitAcks waits until at least n commits were acknowledged in all.
func (l *Load) WaitAcks(n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for l.acks.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("workload: %d of %d commits acknowledged after %s", l.acks.Load(), n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// WaitServedSince waits until every writer had a commit acknowledged
// after t: the cluster serves all its clients again.
func (l *Load) WaitServedSince(t time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var waiting []int
		for _, w := range l.writers {
			if w.lastAck.Load() <= t.UnixNano() {
				waiting = append(waiting, w.ID)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workload: writers %v had no commit acknowledged within %s after %s",
				waiting, timeout, t.Format("15:04:05.000"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop ends the writers (cancelling cycles in flight: their outcome stays
// unknown) and returns what they know.
func (l *Load) Stop() []*Writer {
	l.cancel()
	l.wg.Wait()
	for _, tr := range l.transports {
		tr.CloseIdleConnections()
	}
	return l.writers
}

// Violations lists what the writers saw going wrong while they ran
// (fencing tokens that did not grow).
func (l *Load) Violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.violations...)
}

// Summary describes the writers' outcome in one line; call it after Stop.
func Summary(writers []*Writer) string {
	var acked, attempted, failed int64
	errs := map[string]int{}
	for _, w := range writers {
		acked += int64(len(w.Acked))
		attempted += w.LastAttempted
		failed += int64(w.Failures)
		for k, v := range w.Errors {
			errs[k] += v
		}
	}
	return fmt.Sprintf("%d writers: %d commits acknowledged of %d attempted, %d failed cycles %v",
		len(writers), acked, attempted, failed, errs)
}

type tlsKey struct{}

// WithTLS makes the calls made with ctx (Verify, Metrics, Leaders,
// WaitLeader, WaitConverged, ProbeWrite) dial https endpoints with cfg, as
// Config.TLS does for the writers.
func WithTLS(ctx context.Context, cfg *tls.Config) context.Context {
	return context.WithValue(ctx, tlsKey{}, cfg)
}

// transport is a transport dialing with the TLS configuration of ctx.
func transport(ctx context.Context) *http.Transport {
	cfg, _ := ctx.Value(tlsKey{}).(*tls.Config)
	return &http.Transport{TLSClientConfig: cfg}
}

// Verify reads every key the writers touched through every endpoint and
// checks that each acknowledged commit is there, that nothing appears that
// was never written or contradicts the commits' order, and that all
// endpoints answer the same. Reads are linearizable, so each node answers
// from its own state once it has applied what the leader committed.
func Verify(ctx context.Context, endpoints []string, writers []*Writer) error {
	type view struct {
		rolling map[int]string // writer -> rolling document
		errs    []error
	}
	views := make([]view, len(endpoints))
	var wg sync.WaitGroup
	for e, ep := range endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[e] = view{rolling: map[int]string{}}
			views[e].errs = verifyOne(ctx, ep, writers, views[e].rolling)
		}()
	}
	wg.Wait()
	var errs []error
	for e := range views {
		errs = append(errs, views[e].errs...)
		for _, w := range writers {
			if got, want := views[e].rolling[w.ID], views[0].rolling[w.ID]; got != want {
				errs = append(errs, fmt.Errorf("%s: %s holds %s, but %s holds %s", endpoints[e], w.RollingKey(), got,
					endpoints[0], want))
			}
		}
	}
	if len(errs) > 20 {
		errs = append(errs[:20], fmt.Errorf("... and %d more", len(errs)-20))
	}
	return errors.Join(errs...)
}

func verifyOne(ctx context.Context, endpoint string, writers []*Writer, rolling map[int]string) []error {
	tr := transport(ctx)
	defer tr.CloseIdleConnections()
	c, err := client.New(endpoint, client.WithRetry(5*time.Second), client.WithHTTPClient(&http.Client{Transport: tr,
		Timeout: 10 * time.Second}))
	if err != nil {
		return []error{err}
	}
	var errs []error
	read := func(key string) (*Doc, string, error) {
		d, err := c.GetPublic(ctx, "", key)
		if err != nil {
			return nil, "", fmt.Errorf("%s: get %s: %w", endpoint, key, err)
		}
		if !d.Exists {
			return nil, "", nil
		}
		var doc Doc
		if err := json.Unmarshal(d.Body, &doc); err != nil {
			return nil, "", fmt.Errorf("%s: %s holds %q: %w", endpoint, key, d.Body, err)
		}
		return &doc, fmt.Sprintf("%s (version %d)", d.Body, d.Version), nil
	}
	for _, w := range writers {
		doc, desc, err := read(w.RollingKey())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rolling[w.ID] = desc
		var last int64
		switch {
		case doc == nil && w.LastAcked > 0:
			errs = append(errs, fmt.Errorf("%s: %s has no document, but attempt %d was acknowledged", endpoint,
				w.RollingKey(), w.LastAcked))
		case doc == nil:
		case doc.Writer != w.ID || doc.N < w.LastAcked || doc.N > w.LastAttempted:
			errs = append(errs, fmt.Errorf("%s: %s holds %s; acknowledged up to %d, attempted up to %d",
				endpoint, w.RollingKey(), desc, w.LastAcked, w.LastAttempted))
		default:
			last = doc.N
		}
		for n := int64(1); n <= w.LastAttempted+1; n++ {
			doc, desc, err := read(w.AttemptKey(n))
			switch {
			case err != nil:
				errs = append(errs, err)
			case doc == nil && w.Acked[n]:
				errs = append(errs, fmt.Errorf("%s: acknowledged commit %s is missing", endpoint, w.AttemptKey(n)))
			case doc == nil:
			case doc.Writer != w.ID || doc.N != n:
				errs = append(errs, fmt.Errorf("%s: %s holds %s", endpoint, w.AttemptKey(n), desc))
			case n > last:
				// Committed, but the rolling key (written in the same
				// transaction) says an earlier attempt was the last.
				errs = append(errs, fmt.Errorf("%s: %s is committed but %s holds attempt %d: not atomic",
					endpoint, w.AttemptKey(n), w.RollingKey(), last))
			}
		}
	}
	return errs
}

// Metrics reads the unlabelled samples of an endpoint's /metrics.
func Metrics(ctx context.Context, endpoint string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(endpoint, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	tr := transport(ctx)
	tr.DisableKeepAlives = true
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", endpoint, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.ContainsAny(line, "{}") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return out, sc.Err()
}

// Leaders lists the indexes of the endpoints whose node reports leading
// (raftlockd_raft_is_leader), with the terms they report. Endpoints that do
// not answer are left out.
func Leaders(ctx context.Context, endpoints []string) (leaders []int, terms []float64) {
	for i, ep := range endpoints {
		m, err := Metrics(ctx, ep)
		if err != nil {
			continue
		}
		if m["raftlockd_raft_is_leader"] == 1 {
			leaders, terms = append(leaders, i), append(terms, m["raftlockd_raft_term"])
		}
	}
	return leaders, terms
}

// WaitLeader waits until exactly one of endpoints reports leading and
// returns its index; skip names endpoints not to ask (a paused node still
// believes it leads).
func WaitLeader(ctx context.Context, endpoints []string, timeout time.Duration, skip ...int) (int, error) {
	var ask []string
	var index []int
	for i, ep := range endpoints {
		skipped := false
		for _, s := range skip {
			skipped = skipped || s == i
		}
		if !skipped {
			ask, index = append(ask, ep), append(index, i)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		if leaders, _ := Leaders(ctx, ask); len(leaders) == 1 {
			return index[leaders[0]], nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("workload: no single leader among %v after %s", ask, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitConverged waits until every endpoint reports the same applied index
// and the same commit index in two consecutive rounds, and returns the
// applied index. (The applied index may stay below the commit index by
// raft's own no-op entries, which never reach the state machine.)
func WaitConverged(ctx context.Context, endpoints []string, timeout time.Duration) (uint64, error) {
	deadline := time.Now().Add(timeout)
	var prev string
	var last []string
	for {
		var applied, commit float64
		same := true
		last = last[:0]
		for i, ep := range endpoints {
			m, err := Metrics(ctx, ep)
			if err != nil {
				same = false
				last = append(last, fmt.Sprintf("%s: %v", ep, err))
				continue
			}
			a, c := m["raftlockd_raft_applied_index"], m["raftlockd_raft_commit_index"]
			last = append(last, fmt.Sprintf("%s: applied %.0f commit %.0f", ep, a, c))
			if i == 0 {
				applied, commit = a, c
			}
			same = same && a == applied && c == commit && a > 0
		}
		round := strings.Join(last, ", ")
		if same && round == prev {
			return uint64(applied), nil
		}
		prev = round
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("workload: nodes did not converge within %s: %s", timeout, round)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ProbeWrite acquires (and releases) fresh keys through endpoint, each try
// with one request and no retries, until one is acknowledged, and returns
// how long after since that was. It is the failover clock: started right
// after a leader was killed, it measures when the cluster accepts writes
// again through a surviving node.
func ProbeWrite(ctx context.Context, endpoint, prefix string, since time.Time, timeout time.Duration) (time.Duration, error) {
	tr := transport(ctx)
	defer tr.CloseIdleConnections()
	c, err := client.New(endpoint, client.WithRetry(0), client.WithHTTPClient(&http.Client{Transport: tr, Timeout: 5 * time.Second}))
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for i := 0; ; i++ {
		l, err := c.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("%s-%d", prefix, i), Owner: "probe", TTLSeconds: 10,
			BlockSecs: -1})
		if err == nil {
			took := time.Since(since)
			_ = l.Release(ctx, false)
			return took, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("workload: no write acknowledged through %s within %s: %w", endpoint, timeout, lastErr)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
