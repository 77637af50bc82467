package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

func newEnvWith(t *testing.T, adjust func(*config.Server)) *env {
	t.Helper()
	cfg := testutil.Config(t, t.TempDir())
	adjust(&cfg)
	srv := testutil.StartServer(t, cfg)
	return envOf(t, srv)
}

func (e *env) describe(key string) wire.DescribeResponse {
	e.t.Helper()
	var d wire.DescribeResponse
	r := e.do(http.MethodGet, "/v1/describe?key="+key, nil, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("describe %s: %d %s", key, r.status, r.body)
	}
	r.json(e.t, &d)
	return d
}

// localWaiters is how many acquire handlers wait on this node.
func (e *env) localWaiters() int {
	e.t.Helper()
	for _, line := range strings.Split(string(e.do(http.MethodGet, "/metrics", nil, "").body), "\n") {
		if v, ok := strings.CutPrefix(line, "raftlockd_lease_waiters_local "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				e.t.Fatalf("raftlockd_lease_waiters_local %q", v)
			}
			return n
		}
	}
	e.t.Fatal("no raftlockd_lease_waiters_local metric")
	return 0
}

// answer is the outcome of a request sent in the background.
type answer struct {
	r   resp
	err error
}

// postAsync sends an acquire that may wait; cancelling ctx drops the
// connection as a client that goes away would.
func (e *env) postAsync(ctx context.Context, header map[string]string, body wire.AcquireRequest) <-chan answer {
	out := make(chan answer, 1)
	raw, _ := json.Marshal(body)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/acquire", strings.NewReader(string(raw)))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := e.hc.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		out <- answer{r: resp{status: res.StatusCode, header: res.Header, body: b}, err: err}
	}()
	return out
}

// A retry of a queued acquire takes the first attempt's place over: when
// the first attempt's client goes away, the retry keeps waiting and gets
// the lease in the first attempt's turn.
func TestRetriedAcquireKeepsItsPlaceWhenTheFirstAttemptGoesAway(t *testing.T) {
	e := newEnv(t)
	holder := e.acquire(wire.AcquireRequest{Key: "q", TTLSeconds: 30}, nil)
	idem := map[string]string{wire.HeaderIdempotencyKey: "R1"}
	req := wire.AcquireRequest{Key: "q", Owner: "retrier", TTLSeconds: 30, BlockSecs: 30}

	actx, dropA := context.WithCancel(context.Background())
	defer dropA()
	a := e.postAsync(actx, idem, req)
	testutil.WaitFor(t, 5*time.Second, "the first attempt to queue", func() bool { return e.describe("q").Waiters == 1 })
	later := e.postAsync(context.Background(), nil, wire.AcquireRequest{Key: "q", Owner: "later", TTLSeconds: 30, BlockSecs: 30})
	testutil.WaitFor(t, 5*time.Second, "a later acquirer to queue", func() bool { return e.describe("q").Waiters == 2 })

	b := e.postAsync(context.Background(), idem, req)
	testutil.WaitFor(t, 5*time.Second, "the retry to wait", func() bool { return e.localWaiters() == 3 })
	dropA()
	if got := <-a; got.err == nil {
		t.Fatalf("the first attempt answered although its client went away: %d %s", got.r.status, got.r.body)
	}
	// The first attempt's handler has withdrawn what it could; the retry
	// still waits and the request is still queued, ahead of the later one.
	testutil.WaitFor(t, 5*time.Second, "the first attempt's handler to end", func() bool { return e.localWaiters() < 3 })
	if d := e.describe("q"); d.Waiters != 2 {
		t.Fatalf("the first attempt's cancel withdrew the retried request: %+v", d)
	}
	select {
	case got := <-b:
		t.Fatalf("the retry was answered when the first attempt went away: %d %s", got.r.status, got.r.body)
	default:
	}
	if r := e.release(holder, false); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	select {
	case got := <-b:
		var l wire.AcquireResponse
		got.r.json(t, &l)
		if got.r.status != http.StatusOK || l.Owner != "retrier" || l.FencingToken != holder.FencingToken+1 {
			t.Fatalf("retry: %d %s", got.r.status, got.r.body)
		}
		if r := e.release(l, false); r.status != http.StatusOK {
			t.Fatalf("release: %d %s", r.status, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retry was not granted the lease")
	}
	select {
	case got := <-later:
		if got.r.status != http.StatusOK {
			t.Fatalf("later acquirer: %d %s", got.r.status, got.r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the later acquirer was not granted the lease")
	}
}

// A retry that does not wait (block_seconds -1) answers at once and leaves
// the queued first attempt alone.
func TestNonBlockingRetryLeavesTheQueuedAttempt(t *testing.T) {
	e := newEnv(t)
	holder := e.acquire(wire.AcquireRequest{Key: "q", TTLSeconds: 30}, nil)
	idem := map[string]string{wire.HeaderIdempotencyKey: "R2"}
	a := e.postAsync(context.Background(), idem, wire.AcquireRequest{Key: "q", Owner: "o", TTLSeconds: 30, BlockSecs: 30})
	testutil.WaitFor(t, 5*time.Second, "the first attempt to queue", func() bool { return e.describe("q").Waiters == 1 })
	env := wantErr(t, e.post("/v1/acquire", idem, wire.AcquireRequest{Key: "q", Owner: "o", TTLSeconds: 30, BlockSecs: -1}), 409, "waiting")
	if ra, _ := env["retry_after_seconds"].(float64); ra < 20 {
		t.Fatalf("retry hint %v, want the holder's remaining TTL", env)
	}
	if d := e.describe("q"); d.Waiters != 1 {
		t.Fatalf("the retry withdrew the first attempt: %+v", d)
	}
	e.release(holder, false)
	select {
	case got := <-a:
		if got.r.status != http.StatusOK {
			t.Fatalf("first attempt: %d %s", got.r.status, got.r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first attempt was not granted the lease")
	}
}

// TTLs are resolved as lockd does: zero or negative is the default, above
// the maximum is the maximum.
func TestTTLIsClampedToTheMaximum(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.DefaultTTL, c.MaxTTL = 20*time.Second, 2*time.Minute })
	wantExpiry := func(what string, at int64, ttl time.Duration) {
		t.Helper()
		if d := time.Until(time.Unix(at, 0)); d < ttl-5*time.Second || d > ttl+time.Second {
			t.Fatalf("%s: expires in %s, want about %s", what, d, ttl)
		}
	}
	big := e.acquire(wire.AcquireRequest{Key: "big", TTLSeconds: 1 << 40}, nil)
	wantExpiry("ttl above the maximum", big.ExpiresAt, 2*time.Minute)
	neg := e.acquire(wire.AcquireRequest{Key: "neg", TTLSeconds: -7}, nil)
	wantExpiry("negative ttl", neg.ExpiresAt, 20*time.Second)

	ka := func(l wire.AcquireResponse, ttl int64) wire.KeepAliveResponse {
		t.Helper()
		r := e.post("/v1/keepalive", leaseHeaders(l), wire.KeepAliveRequest{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID, TTLSeconds: ttl})
		if r.status != http.StatusOK {
			t.Fatalf("keepalive %d: %d %s", ttl, r.status, r.body)
		}
		var out wire.KeepAliveResponse
		r.json(t, &out)
		return out
	}
	wantExpiry("keepalive above the maximum", ka(neg, 1<<40).ExpiresAt, 2*time.Minute)
	wantExpiry("negative keepalive", ka(big, -1).ExpiresAt, 20*time.Second)
}

// A key never used is described as lockd describes it: version 0.
func TestDescribeOfAnUnusedKey(t *testing.T) {
	e := newEnv(t)
	r := e.do(http.MethodGet, "/v1/describe?namespace=Other&key=never/used", nil, "")
	if r.status != http.StatusOK {
		t.Fatalf("describe: %d %s", r.status, r.body)
	}
	var raw map[string]any
	r.json(t, &raw)
	if raw["namespace"] != "other" || raw["key"] != "never/used" || raw["version"] != float64(0) || raw["lease_id"] != nil {
		t.Fatalf("describe of an unused key: %s", r.body)
	}
	wantErr(t, e.do(http.MethodGet, "/v1/describe?key=", nil, ""), 400, "missing_key")
}

// X-Expected-SHA256 and X-Expected-Bytes answer with lockd's codes.
func TestExpectedChecksumAndSize(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "x", TTLSeconds: 30}, nil)
	doc := `{"a": 1}`
	raw := sha256.Sum256([]byte(doc))
	real := hex.EncodeToString(raw[:])
	sum := strings.Repeat("ab", 32) // not the body's
	with := func(k, v string) map[string]string {
		h := leaseHeaders(l)
		h[k] = v
		return h
	}
	upd := func(h map[string]string) resp { return e.do(http.MethodPost, "/v1/update"+q(l), h, doc) }
	wantErr(t, upd(with(wire.HeaderExpectedSHA256, sum)), 409, "expected_sha256_mismatch")
	wantErr(t, upd(with(wire.HeaderExpectedSHA256, "zz"+sum[2:])), 400, "invalid_expected_sha256")
	wantErr(t, upd(with(wire.HeaderExpectedSHA256, sum[:10])), 400, "invalid_expected_sha256")
	wantErr(t, upd(with(wire.HeaderExpectedBytes, "7")), 409, "expected_bytes_mismatch")
	wantErr(t, upd(with(wire.HeaderExpectedBytes, "seven")), 400, "invalid_expected_bytes")
	// The right claims (the digest of the bytes sent, in either case) pass.
	good := with(wire.HeaderExpectedBytes, "8")
	good[wire.HeaderExpectedSHA256] = strings.ToUpper(real)
	if r := upd(good); r.status != http.StatusOK {
		t.Fatalf("update with matching claims: %d %s", r.status, r.body)
	}
}

// As in lockd, get with public=1 and a lease reads the holder's view, and a
// public value that is not a boolean counts as false.
func TestPublicGetWithALeaseReadsTheHoldersView(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "p", TTLSeconds: 30}, nil)
	if r := e.update(l, `{"staged":true}`); r.status != http.StatusOK {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodPost, "/v1/get"+q(l)+"&public=1", leaseHeaders(l), ""); r.status != 200 || string(r.body) != `{"staged":true}` {
		t.Fatalf("public=1 with a lease: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodPost, "/v1/get"+q(l)+"&public=yes", leaseHeaders(l), ""); r.status != 200 || string(r.body) != `{"staged":true}` {
		t.Fatalf("public=yes with a lease: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodPost, "/v1/get"+q(l)+"&public=true", nil, ""); r.status != http.StatusNoContent {
		t.Fatalf("public read of a staged write: %d %s", r.status, r.body)
	}
	wantErr(t, e.do(http.MethodPost, "/v1/get"+q(l)+"&public=yes", nil, ""), 400, "missing_lease")
}

// block_seconds 0 waits up to the server's --acquire-block, a larger value
// is capped there, and the 409 that ends a wait says when the holder's
// lease runs out.
func TestBlockSecondsAgainstTheServerLimit(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.AcquireBlock = 2 * time.Second })
	e.acquire(wire.AcquireRequest{Key: "b", TTLSeconds: 40}, nil)
	for _, block := range []int64{0, 1 << 40} {
		start := time.Now()
		env := wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "b", Owner: "w", BlockSecs: block}), 409, "waiting")
		took := time.Since(start)
		if took < 1900*time.Millisecond || took > 15*time.Second {
			t.Fatalf("block_seconds %d: answered after %s, want the server's 2s", block, took)
		}
		if ra, _ := env["retry_after_seconds"].(float64); ra < 25 || ra > 40 {
			t.Fatalf("block_seconds %d: retry hint %v, want the holder's remaining TTL", block, env)
		}
		if d := e.describe("b"); d.Waiters != 0 {
			t.Fatalf("the waiter stayed queued: %+v", d)
		}
	}
}

// Release answers as lockd does where that is safe: a lease that is gone
// with nothing known of its transaction is released; a commit that cannot
// happen is a 409, never released: true.
func TestReleaseAnswers(t *testing.T) {
	e := newEnv(t)
	// Nothing known (never there, or forgotten after --tc-decision-retention).
	r := e.post("/v1/release", nil, wire.ReleaseRequest{Key: "gone", LeaseID: xid.New().String(), TxnID: xid.New().String()})
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"released":true`) {
		t.Fatalf("release of an unknown lease: %d %s", r.status, r.body)
	}
	// A wrong fencing token on the current lease releases nothing.
	l := e.acquire(wire.AcquireRequest{Key: "r", TTLSeconds: 30}, nil)
	e.update(l, `{"v":1}`)
	h := leaseHeaders(l)
	h[wire.HeaderFencingToken] = "99"
	wantErr(t, e.post("/v1/release", h, wire.ReleaseRequest{Key: "r", LeaseID: l.LeaseID, TxnID: l.TxnID}), 409, "lease_mismatch")
	if d := e.describe("r"); d.LeaseID != l.LeaseID || d.Version != 0 {
		t.Fatalf("after a rejected release: %+v", d)
	}
	if r := e.release(l, false); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	// A stale holder is answered from its own transaction's record.
	next := e.acquire(wire.AcquireRequest{Key: "r", TTLSeconds: 30}, nil)
	if r := e.release(l, false); r.status != http.StatusOK {
		t.Fatalf("retried release after the key moved on: %d %s", r.status, r.body)
	}
	wantErr(t, e.release(l, true), 409, "txn_committed")
	if d := e.describe("r"); d.LeaseID != next.LeaseID {
		t.Fatalf("a stale release touched the next holder: %+v", d)
	}
}

// txn_rolled_back and txn_too_large over HTTP.
func TestTransactionCodes(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "t0", TTLSeconds: 60}, nil)
	e.update(l, `{"v":1}`)
	if r := e.release(l, true); r.status != http.StatusOK {
		t.Fatalf("rollback: %d %s", r.status, r.body)
	}
	wantErr(t, e.release(l, false), 409, "txn_rolled_back")
	wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "t1", Owner: "o", TxnID: l.TxnID}), 409, "txn_rolled_back")

	big := e.acquire(wire.AcquireRequest{Key: "big-0", TTLSeconds: 120}, nil)
	var wg sync.WaitGroup
	errs := make(chan string, fsm.MaxParticipants)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 1 + w; i < fsm.MaxParticipants; i += 8 {
				r := e.post("/v1/acquire", nil, wire.AcquireRequest{Key: fmt.Sprint("big-", i), Owner: "o", TTLSeconds: 120, TxnID: big.TxnID})
				if r.status != http.StatusOK {
					errs <- fmt.Sprintf("key %d: %d %s", i, r.status, r.body)
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Fatal(msg)
	}
	wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "one-too-many", Owner: "o", TxnID: big.TxnID}), 409, "txn_too_large")
	// A key the transaction holds is still its own.
	again := e.acquire(wire.AcquireRequest{Key: "big-7", TxnID: big.TxnID}, nil)
	if again.TxnID != big.TxnID {
		t.Fatalf("%+v", again)
	}
	if r := e.release(big, false); r.status != http.StatusOK {
		t.Fatalf("release of 1024 keys: %d %s", r.status, r.body)
	}
}

// A transaction's expires_at_unix (decide and prepare) is 0 or lies in the
// future, at most --max-ttl from now: anything else is 400 invalid_ttl and
// records nothing.
func TestTransactionExpiryIsBounded(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.MaxTTL = 10 * time.Minute }).operator()
	// A prepare as another island's coordinator sends it (decide ignores
	// the coordinator's fields); every transaction locks a key of its own.
	decision := func(txn string, expires int64) string {
		return fmt.Sprintf(`{"txn_id":%q,"state":"pending","participants":[{"key":%[1]q}],"expires_at_unix":%d,`+
			`"tc_backend_hash":"other","tc_term":1}`, txn, expires)
	}
	now := time.Now().Unix()
	cases := []struct {
		name    string
		expires int64
	}{
		{"negative", -1},
		{"past", now - 60},
		{"beyond max-ttl and the islands' clock skew", now + 12*60},
		{"year 292 million", 9223372036854775},
		{"overflowing milliseconds", math.MaxInt64},
	}
	for _, c := range cases {
		for _, path := range []string{"/v1/txn/decide", "/v1/txn/prepare"} {
			t.Run(c.name+path, func(t *testing.T) {
				txn := xid.New().String()
				wantErr(t, e.post(path, nil, decision(txn, c.expires)), http.StatusBadRequest, "invalid_ttl")
				wantErr(t, e.do(http.MethodGet, "/v1/txn/status?txn_id="+txn, nil, ""), http.StatusNotFound, "not_found")
			})
		}
	}
	// At the bound the decision is recorded with that expiry.
	txn := xid.New().String()
	if r := e.post("/v1/txn/decide", nil, decision(txn, now+10*60)); r.status != http.StatusOK {
		t.Fatalf("decide: %d %s", r.status, r.body)
	}
	var st wire.TxnStatusResponse
	e.do(http.MethodGet, "/v1/txn/status?txn_id="+txn, nil, "").json(t, &st)
	if st.State != wire.TxnStatePending || st.ExpiresAtUnix != now+10*60 {
		t.Fatalf("status %+v", st)
	}
	// Another island's prepare may run up to a minute ahead of this clock;
	// a decide here may not.
	skewed := xid.New().String()
	wantErr(t, e.post("/v1/txn/decide", nil, decision(skewed, now+10*60+30)), http.StatusBadRequest, "invalid_ttl")
	if r := e.post("/v1/txn/prepare", nil, decision(skewed, now+10*60+30)); r.status != http.StatusOK {
		t.Fatalf("prepare within the skew allowance: %d %s", r.status, r.body)
	}
	// A rollback resent with an expiry that has passed is a decision all
	// the same: the expiry only bounds a prepare.
	rollback := fmt.Sprintf(`{"txn_id":%q,"state":"rollback","expires_at_unix":%d}`, txn, now-60)
	if r := e.post("/v1/txn/decide", nil, rollback); r.status != http.StatusOK {
		t.Fatalf("rollback with a past expiry: %d %s", r.status, r.body)
	}
}

// X-Raftlockd-Timeout gives the request a deadline; a malformed one is a 400.
func TestClientTimeoutHeader(t *testing.T) {
	e := newEnv(t)
	for _, v := range []string{"soon", "0s", "-1s", "1000h"} {
		wantErr(t, e.do(http.MethodGet, "/v1/describe?key=k", map[string]string{wire.HeaderTimeout: v}, ""), 400, "invalid_timeout")
	}
	if r := e.do(http.MethodGet, "/v1/describe?key=k", map[string]string{wire.HeaderTimeout: "1.5s"}, ""); r.status != http.StatusOK {
		t.Fatalf("describe with a timeout: %d %s", r.status, r.body)
	}
	// A blocked acquire ends when the client's time is up.
	e.acquire(wire.AcquireRequest{Key: "k", TTLSeconds: 30}, nil)
	start := time.Now()
	env := wantErr(t, e.post("/v1/acquire", map[string]string{wire.HeaderTimeout: "800ms"},
		wire.AcquireRequest{Key: "k", Owner: "w", BlockSecs: 30}), 409, "waiting")
	if took := time.Since(start); took < 700*time.Millisecond || took > 5*time.Second {
		t.Fatalf("acquire with an 800ms timeout answered after %s", took)
	}
	if env["retry_after_seconds"] == nil {
		t.Fatalf("no retry hint: %v", env)
	}
	if d := e.describe("k"); d.Waiters != 0 {
		t.Fatalf("the timed-out acquire stayed queued: %+v", d)
	}
}

// The Go client sends its context's deadline along.
func TestClientSendsItsDeadline(t *testing.T) {
	var mu sync.Mutex
	var got []string
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(wire.HeaderTimeout))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"namespace":"default","key":"k","version":0}`))
	}))
	defer rec.Close()
	c, err := client.New(rec.URL, client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Describe(context.Background(), "", "k"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if _, err := c.Describe(ctx, "", "k"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "" {
		t.Fatalf("timeout headers %q: want none without a deadline", got)
	}
	d, err := time.ParseDuration(got[1])
	if err != nil || d <= time.Second || d > 1500*time.Millisecond {
		t.Fatalf("timeout header %q for a 1.5s deadline", got[1])
	}
}

// X-If-State-ETag: "" (an empty ETag, quoted as ETags are) is a condition,
// as in lockd: the holder's view has no document. A key that gained a
// document since the caller saw it empty is 409 etag_mismatch, not
// overwritten; an empty header value is no condition.
func TestAnEmptyQuotedStateETagIsACondition(t *testing.T) {
	e := newEnv(t)
	node := e.srv.Node()
	testutil.WaitFor(t, 10*time.Second, "the island to adopt this build's rules", func() bool {
		return node.FSM().Rules() >= fsm.EntryFormat
	})
	first := e.acquire(wire.AcquireRequest{Key: "etag-empty", TTLSeconds: 30}, nil)
	h := leaseHeaders(first)
	h[wire.HeaderIfStateETag] = `""`
	if r := e.do(http.MethodPost, "/v1/update"+q(first), h, `{"n":1}`); r.status != http.StatusOK {
		t.Fatalf("update of an absent document under If-State-ETag \"\": %d %s", r.status, r.body)
	}
	// Its own staged write is in the holder's view: the document exists now.
	env := wantErr(t, e.do(http.MethodPost, "/v1/update"+q(first), h, `{"n":2}`), http.StatusConflict, "etag_mismatch")
	if env["current_etag"] == "" || env["current_etag"] == nil {
		t.Fatalf("conflict without the current etag: %v", env)
	}
	if r := e.release(first, false); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	second := e.acquire(wire.AcquireRequest{Key: "etag-empty", TTLSeconds: 30}, nil)
	h = leaseHeaders(second)
	h[wire.HeaderIfStateETag] = `""`
	wantErr(t, e.do(http.MethodPost, "/v1/update"+q(second), h, `{"n":3}`), http.StatusConflict, "etag_mismatch")
	wantErr(t, e.do(http.MethodPost, "/v1/remove"+q(second), h, ""), http.StatusConflict, "etag_mismatch")
	// After a staged removal the holder's view is empty again.
	if r := e.do(http.MethodPost, "/v1/remove"+q(second), leaseHeaders(second), ""); r.status != http.StatusOK {
		t.Fatalf("remove: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodPost, "/v1/update"+q(second), h, `{"n":4}`); r.status != http.StatusOK {
		t.Fatalf("update after a staged removal under If-State-ETag \"\": %d %s", r.status, r.body)
	}
	// An empty header value is no condition.
	h[wire.HeaderIfStateETag] = ""
	if r := e.do(http.MethodPost, "/v1/update"+q(second), h, `{"n":5}`); r.status != http.StatusOK {
		t.Fatalf("update with an empty If-State-ETag: %d %s", r.status, r.body)
	}
	if r := e.release(second, false); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	if p := e.publicGet("default", "etag-empty"); string(p.body) != `{"n":5}` {
		t.Fatalf("committed: %d %s", p.status, p.body)
	}
}

// wait_seconds 0 waits up to the server's --acquire-block and a larger value
// is capped there; the 409 that ends the wait hints at the wait the server
// did, not at the longer one asked for.
func TestWaitSecondsAgainstTheServerLimit(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.AcquireBlock = time.Second })
	for wait, hint := range map[int64]float64{0: 1, 30: 1} {
		start := time.Now()
		r := e.dequeueRaw(fmt.Sprintf(`{"queue":"empty","owner":"w","wait_seconds":%d}`, wait))
		env := wantErr(t, r, http.StatusConflict, "waiting")
		if took := time.Since(start); took < 900*time.Millisecond || took > 15*time.Second {
			t.Fatalf("wait_seconds %d: answered after %s, want the server's 1s", wait, took)
		}
		if env["retry_after_seconds"] != hint || r.header.Get("Retry-After") != fmt.Sprint(hint) {
			t.Fatalf("wait_seconds %d: retry hint %v (Retry-After %q), want %v", wait, env, r.header.Get("Retry-After"), hint)
		}
	}
}
