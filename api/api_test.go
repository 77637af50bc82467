package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/xid"
	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"))
}

// env is a node and an HTTP client for it that presents a client
// certificate allowed every namespace.
type env struct {
	t   *testing.T
	url string
	srv *server.Server
	hc  *http.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return envOf(t, testutil.StartServer(t, testutil.Config(t, t.TempDir())))
}

// envOf is an env for a node of the shared test CA.
func envOf(t *testing.T, srv *server.Server) *env {
	return &env{t: t, url: srv.URL(), srv: srv, hc: testutil.HTTPClient(t, nil)}
}

// operator is the env with an HTTP client that presents a server
// certificate, as an operator does for the administrative endpoints.
func (e *env) operator() *env {
	op := *e
	op.hc = testutil.OperatorHTTPClient(e.t)
	return &op
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
}

func (e *env) do(method, path string, header map[string]string, body string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := e.hc.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (e *env) post(path string, header map[string]string, body any) resp {
	e.t.Helper()
	s, ok := body.(string)
	if !ok {
		raw, _ := json.Marshal(body)
		s = string(raw)
	}
	return e.do(http.MethodPost, path, header, s)
}

// wantErr checks status and the stable error code of an envelope.
func wantErr(t *testing.T, r resp, status int, code string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	var env map[string]any
	if err := json.Unmarshal(r.body, &env); err != nil {
		t.Fatalf("error body is not JSON: %q", r.body)
	}
	if env["error"] != code {
		t.Fatalf("error %v, want %s (body %s)", env["error"], code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q", ct)
	}
	return env
}

func (e *env) acquire(req wire.AcquireRequest, header map[string]string) wire.AcquireResponse {
	e.t.Helper()
	if req.Owner == "" {
		req.Owner = "tester"
	}
	r := e.post("/v1/acquire", header, req)
	if r.status != http.StatusOK {
		e.t.Fatalf("acquire: %d %s", r.status, r.body)
	}
	var out wire.AcquireResponse
	r.json(e.t, &out)
	return out
}

func leaseHeaders(l wire.AcquireResponse) map[string]string {
	return map[string]string{wire.HeaderLeaseID: l.LeaseID, wire.HeaderTxnID: l.TxnID,
		wire.HeaderFencingToken: strconv.FormatInt(l.FencingToken, 10)}
}

func q(l wire.AcquireResponse) string { return "?namespace=" + l.Namespace + "&key=" + l.Key }

func (e *env) update(l wire.AcquireResponse, doc string) resp {
	return e.do(http.MethodPost, "/v1/update"+q(l), leaseHeaders(l), doc)
}

func (e *env) release(l wire.AcquireResponse, rollback bool) resp {
	return e.post("/v1/release", leaseHeaders(l), wire.ReleaseRequest{Namespace: l.Namespace, Key: l.Key,
		LeaseID: l.LeaseID, TxnID: l.TxnID, Rollback: rollback})
}

func (e *env) publicGet(ns, key string) resp {
	return e.do(http.MethodPost, "/v1/get?public=1&namespace="+ns+"&key="+key, nil, "")
}

func TestAcquireGrantsFencedLeases(t *testing.T) {
	e := newEnv(t)
	r := e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "k1", Owner: "w1", TTLSeconds: 30})
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var l wire.AcquireResponse
	r.json(t, &l)
	if l.Namespace != "default" || l.Key != "k1" || l.Owner != "w1" || l.FencingToken != 1 {
		t.Fatalf("lease %+v", l)
	}
	if _, err := xid.FromString(l.LeaseID); err != nil {
		t.Fatalf("lease id %q is not an xid", l.LeaseID)
	}
	if _, err := xid.FromString(l.TxnID); err != nil {
		t.Fatalf("minted txn id %q is not an xid", l.TxnID)
	}
	if d := time.Until(time.Unix(l.ExpiresAt, 0)); d < 25*time.Second || d > 31*time.Second {
		t.Fatalf("expires in %s", d)
	}
	if r.header.Get(wire.HeaderFencingToken) != "1" || r.header.Get(wire.HeaderKeyVersion) != "0" {
		t.Fatalf("headers %v", r.header)
	}
	if r.header.Get(wire.HeaderCorrelationID) == "" || l.CorrelationID != r.header.Get(wire.HeaderCorrelationID) {
		t.Fatalf("correlation id missing: %v / %q", r.header, l.CorrelationID)
	}
	if r.header.Get(wire.HeaderServedBy) == "" {
		t.Fatal("response does not say which node served it")
	}
	if rr := e.release(l, false); rr.status != 200 {
		t.Fatalf("release %d %s", rr.status, rr.body)
	}
	l2 := e.acquire(wire.AcquireRequest{Key: "k1", TTLSeconds: 30}, nil)
	if l2.FencingToken != 2 {
		t.Fatalf("second token %d, want 2", l2.FencingToken)
	}

	// Key and namespace may come from the query; a missing key is generated.
	r = e.post("/v1/acquire?namespace=Orders&key=from-query", nil, wire.AcquireRequest{Owner: "w"})
	var lq wire.AcquireResponse
	r.json(t, &lq)
	if lq.Namespace != "orders" || lq.Key != "from-query" {
		t.Fatalf("query override: %+v", lq)
	}
	gen := e.acquire(wire.AcquireRequest{}, nil)
	if gen.Key == "" {
		t.Fatal("no key generated")
	}
	// The transaction id may come in the X-Txn-ID header.
	txn := xid.New().String()
	lh := e.acquire(wire.AcquireRequest{Key: "hdr-txn"}, map[string]string{wire.HeaderTxnID: txn})
	if lh.TxnID != txn {
		t.Fatalf("txn from header ignored: %+v", lh)
	}
}

func TestAcquireRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name   string
		body   string
		query  string
		header map[string]string
		status int
		code   string
	}{
		{"bad json", `{"key":`, "", nil, 400, "invalid_body"},
		{"unknown field", `{"key":"a","owner":"o","ttl":3}`, "", nil, 400, "invalid_body"},
		{"trailing data", `{"key":"a","owner":"o"} {}`, "", nil, 400, "invalid_body"},
		{"wrong type", `{"key":"a","owner":"o","ttl_seconds":"x"}`, "", nil, 400, "invalid_body"},
		{"missing owner", `{"key":"a"}`, "", nil, 400, "missing_owner"},
		{"bad block", `{"key":"a","owner":"o","block_seconds":-2}`, "", nil, 400, "invalid_block"},
		{"bad txn", `{"key":"a","owner":"o","txn_id":"not-an-xid"}`, "", nil, 400, "invalid_txn"},
		{"bad txn header", `{"key":"a","owner":"o"}`, "", map[string]string{wire.HeaderTxnID: "zz"}, 400, "invalid_txn"},
		{"reserved namespace", `{"key":"a","owner":"o","namespace":".txns"}`, "", nil, 400, "invalid_namespace"},
		{"bad namespace", `{"key":"a","owner":"o","namespace":"a b"}`, "", nil, 400, "invalid_namespace"},
		{"padded namespace", `{"key":"a","owner":"o","namespace":" a "}`, "", nil, 400, "invalid_namespace"},
		{"dotted capital I namespace", `{"key":"a","owner":"o","namespace":"\u0130"}`, "", nil, 400, "invalid_namespace"},
		{"kelvin sign namespace", `{"key":"a","owner":"o","namespace":"\u212a"}`, "", nil, 400, "invalid_namespace"},
		{"control char key", `{"key":"a\u0000b","owner":"o"}`, "", nil, 400, "invalid_key"},
		// Not turned into U+FFFD, which would make it another request's key.
		{"invalid UTF-8 key", "{\"key\":\"a\xffb\",\"owner\":\"o\"}", "", nil, 400, "invalid_body"},
		{"invalid UTF-8 owner", "{\"key\":\"a\",\"owner\":\"o\xff\"}", "", nil, 400, "invalid_body"},
		{"lone surrogate key", `{"key":"a\ud800","owner":"o"}`, "", nil, 400, "invalid_body"},
		{"lone low surrogate owner", `{"key":"a","owner":"o\udfff"}`, "", nil, 400, "invalid_body"},
		{"long owner", `{"key":"a","owner":"` + strings.Repeat("o", 257) + `"}`, "", nil, 400, "invalid_body"},
		{"control char owner", `{"key":"a","owner":"o\u0007"}`, "", nil, 400, "invalid_body"},
		{"long key", `{"key":"` + strings.Repeat("k", 600) + `","owner":"o"}`, "", nil, 400, "invalid_key"},
		{"message-shaped key", `{"key":"q/jobs/msg/m1","owner":"o"}`, "", nil, 400, "invalid_key"},
		{"state-sidecar-shaped key", `{"key":"q/jobs/state/m1","owner":"o"}`, "", nil, 400, "invalid_key"},
		{"oversize body", `{"key":"a","owner":"` + strings.Repeat("o", 70<<10) + `"}`, "", nil, 413, "request_too_large"},
		{"bad idempotency key", `{"key":"a","owner":"o"}`, "", map[string]string{wire.HeaderIdempotencyKey: strings.Repeat("i", 200)}, 400, "invalid_idempotency_key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantErr(t, e.do(http.MethodPost, "/v1/acquire"+c.query, c.header, c.body), c.status, c.code)
		})
	}
	// None of the rejected requests left a trace.
	_ = e.srv.Node().FSM().View(func(v *fsm.View) error {
		for _, ns := range []string{"default", "a", "i", "k"} {
			if rec, ok := v.Key(ns, "a"); ok {
				t.Errorf("a rejected acquire left a key record in %s: %+v", ns, rec)
			}
		}
		return nil
	})
	// The longest owner the limit allows is taken.
	if l := e.acquire(wire.AcquireRequest{Key: "long-owner", Owner: strings.Repeat("o", 256)}, nil); len(l.Owner) != 256 {
		t.Fatalf("owner of %d bytes", len(l.Owner))
	}
	// ASCII capitals are lower-cased, as lockd clients expect.
	if l := e.acquire(wire.AcquireRequest{Namespace: "Mixed-CASE", Key: "a"}, nil); l.Namespace != "mixed-case" {
		t.Fatalf("namespace %q", l.Namespace)
	}
	wantErr(t, e.do(http.MethodGet, "/v1/acquire", nil, ""), 405, "method_not_allowed")
	wantErr(t, e.do(http.MethodGet, "/v1/nope", nil, ""), 404, "not_found")
	// A path that is not in its clean form names no endpoint: no redirect.
	for _, p := range []string{"//v1/acquire", "/v1//acquire", "/v1/./acquire", "/x/../v1/acquire"} {
		wantErr(t, e.do(http.MethodPost, p, nil, `{"key":"a","owner":"o"}`), 404, "not_found")
	}
}

func TestContendedAcquire(t *testing.T) {
	e := newEnv(t)
	holder := e.acquire(wire.AcquireRequest{Key: "c", TTLSeconds: 30}, nil)

	// block_seconds=-1 never waits.
	env := wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "c", Owner: "x", BlockSecs: -1}), 409, "waiting")
	if env["retry_after_seconds"] == nil {
		t.Fatalf("waiting without retry hint: %v", env)
	}
	wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "c", Owner: "x", IfNotExists: true}), 409, "already_exists")
	// The transaction holding the key is given its lease back.
	own := e.acquire(wire.AcquireRequest{Key: "c", Owner: "x", IfNotExists: true, TxnID: holder.TxnID}, nil)
	if own.LeaseID != holder.LeaseID || own.FencingToken != holder.FencingToken {
		t.Fatalf("if_not_exists by the holding transaction: %+v, want the lease %+v", own, holder)
	}

	// Three blocked acquirers are served in arrival order, each in the
	// step that releases the previous holder.
	type got struct {
		who   int
		lease wire.AcquireResponse
	}
	order := make(chan got, 3)
	for i := 1; i <= 3; i++ {
		go func(i int) {
			r := e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "c", Owner: fmt.Sprint("w", i), TTLSeconds: 30, BlockSecs: 20})
			var l wire.AcquireResponse
			_ = json.Unmarshal(r.body, &l)
			order <- got{i, l}
		}(i)
		testutil.WaitFor(t, 5*time.Second, "waiter to queue", func() bool {
			var d wire.DescribeResponse
			e.do(http.MethodGet, "/v1/describe?key=c", nil, "").json(t, &d)
			return d.Waiters == int64(i)
		})
	}
	cur := holder
	for want := 1; want <= 3; want++ {
		if r := e.release(cur, false); r.status != 200 {
			t.Fatalf("release: %d %s", r.status, r.body)
		}
		select {
		case g := <-order:
			if g.who != want || g.lease.FencingToken != int64(want+1) {
				t.Fatalf("got waiter %d with token %d, want waiter %d with token %d", g.who, g.lease.FencingToken, want, want+1)
			}
			cur = g.lease
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d was not granted the lease", want)
		}
	}

	// A waiter gets the lease when the holder's lease expires.
	short := e.acquire(wire.AcquireRequest{Key: "exp", TTLSeconds: 1}, nil)
	start := time.Now()
	next := e.acquire(wire.AcquireRequest{Key: "exp", TTLSeconds: 30, BlockSecs: 10}, nil)
	if waited := time.Since(start); waited > 3*time.Second {
		t.Fatalf("hand-off on expiry took %s", waited)
	}
	if next.FencingToken != short.FencingToken+1 {
		t.Fatalf("token after expiry %d, want %d", next.FencingToken, short.FencingToken+1)
	}
	wantErr(t, e.release(short, false), 409, "txn_rolled_back")

	// A bounded wait ends with 409 waiting, and the waiter leaves the queue.
	start = time.Now()
	wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "exp", Owner: "late", BlockSecs: 1}), 409, "waiting")
	if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Fatalf("bounded wait returned after %s", waited)
	}
	var d wire.DescribeResponse
	e.do(http.MethodGet, "/v1/describe?key=exp", nil, "").json(t, &d)
	if d.Waiters != 0 || d.LeaseID != next.LeaseID {
		t.Fatalf("after timeout: %+v", d)
	}
}

func TestAcquireWaiterThatDisconnectsLeavesTheQueue(t *testing.T) {
	e := newEnv(t)
	e.acquire(wire.AcquireRequest{Key: "d", TTLSeconds: 30}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/acquire",
			strings.NewReader(`{"key":"d","owner":"gone","block_seconds":30}`))
		if res, err := e.hc.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	describe := func() wire.DescribeResponse {
		var d wire.DescribeResponse
		e.do(http.MethodGet, "/v1/describe?key=d", nil, "").json(t, &d)
		return d
	}
	testutil.WaitFor(t, 5*time.Second, "waiter to queue", func() bool { return describe().Waiters == 1 })
	cancel()
	<-done
	testutil.WaitFor(t, 5*time.Second, "waiter to leave", func() bool { return describe().Waiters == 0 })
}

func TestRetriedAcquireReturnsTheSameLease(t *testing.T) {
	e := newEnv(t)
	h := map[string]string{wire.HeaderIdempotencyKey: "req-1"}
	a := e.acquire(wire.AcquireRequest{Key: "r", TTLSeconds: 30, BlockSecs: 5}, h)
	b := e.acquire(wire.AcquireRequest{Key: "r", TTLSeconds: 30, BlockSecs: 5}, h)
	if a.LeaseID != b.LeaseID || a.FencingToken != b.FencingToken {
		t.Fatalf("retry got another lease: %+v vs %+v", a, b)
	}
}

func TestStateIsStagedUntilReleaseCommits(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "s", TTLSeconds: 30}, nil)
	if r := e.publicGet("default", "s"); r.status != 204 {
		t.Fatalf("public get of empty key: %d %s", r.status, r.body)
	}
	r := e.update(l, `{ "status": "ready", "n": [1, 2] }`)
	if r.status != 200 {
		t.Fatalf("update %d %s", r.status, r.body)
	}
	var u wire.UpdateResponse
	r.json(t, &u)
	if u.NewVersion != 1 || u.NewStateETag == "" || u.Bytes != int64(len(`{"status":"ready","n":[1,2]}`)) {
		t.Fatalf("update response %+v", u)
	}
	if r.header.Get(wire.HeaderETag) != u.NewStateETag || r.header.Get(wire.HeaderKeyVersion) != "1" {
		t.Fatalf("update headers %v", r.header)
	}
	// The holder reads its staged write; the public does not.
	g := e.do(http.MethodPost, "/v1/get"+q(l), leaseHeaders(l), "")
	if g.status != 200 || string(g.body) != `{"status":"ready","n":[1,2]}` {
		t.Fatalf("lease get: %d %s", g.status, g.body)
	}
	if g.header.Get(wire.HeaderETag) != u.NewStateETag || g.header.Get(wire.HeaderFencingToken) != "1" {
		t.Fatalf("lease get headers %v", g.header)
	}
	if r := e.publicGet("default", "s"); r.status != 204 {
		t.Fatalf("staged write visible publicly: %d %s", r.status, r.body)
	}
	if r := e.release(l, false); r.status != 200 || !strings.Contains(string(r.body), `"released":true`) {
		t.Fatalf("release %d %s", r.status, r.body)
	}
	p := e.publicGet("default", "s")
	if p.status != 200 || string(p.body) != `{"status":"ready","n":[1,2]}` || p.header.Get(wire.HeaderKeyVersion) != "1" {
		t.Fatalf("public get after commit: %d %s %v", p.status, p.body, p.header)
	}
	var d wire.DescribeResponse
	e.do(http.MethodGet, "/v1/describe?key=s", nil, "").json(t, &d)
	if d.Version != 1 || d.StateETag != u.NewStateETag || d.UpdatedAt == 0 || d.LeaseID != "" {
		t.Fatalf("describe %+v", d)
	}

	// Rollback discards; remove is staged too.
	l2 := e.acquire(wire.AcquireRequest{Key: "s", TTLSeconds: 30}, nil)
	if l2.Version != 1 || l2.StateETag != u.NewStateETag {
		t.Fatalf("acquire does not report the committed state: %+v", l2)
	}
	e.update(l2, `{"status":"discarded"}`)
	e.release(l2, true)
	if p := e.publicGet("default", "s"); string(p.body) != `{"status":"ready","n":[1,2]}` {
		t.Fatalf("rollback leaked: %s", p.body)
	}
	l3 := e.acquire(wire.AcquireRequest{Key: "s", TTLSeconds: 30}, nil)
	rm := e.do(http.MethodPost, "/v1/remove"+q(l3), leaseHeaders(l3), "")
	var rr wire.RemoveResponse
	rm.json(t, &rr)
	if rm.status != 200 || !rr.Removed || rr.NewVersion != 2 {
		t.Fatalf("remove %d %s", rm.status, rm.body)
	}
	if p := e.publicGet("default", "s"); p.status != 200 {
		t.Fatalf("staged removal visible publicly: %d", p.status)
	}
	e.release(l3, false)
	if p := e.publicGet("default", "s"); p.status != 204 || p.header.Get(wire.HeaderKeyVersion) != "2" {
		t.Fatalf("after committed removal: %d %v", p.status, p.header)
	}
	l4 := e.acquire(wire.AcquireRequest{Key: "s", TTLSeconds: 30}, nil)
	rm = e.do(http.MethodPost, "/v1/remove"+q(l4), leaseHeaders(l4), "")
	rm.json(t, &rr)
	if rr.Removed {
		t.Fatal("removing an absent document reported removed")
	}
}

func TestMultiKeyTransactionCommitsAtomically(t *testing.T) {
	e := newEnv(t)
	a := e.acquire(wire.AcquireRequest{Key: "acct-a", TTLSeconds: 30}, nil)
	b := e.acquire(wire.AcquireRequest{Namespace: "beta", Key: "acct-b", TTLSeconds: 30, TxnID: a.TxnID}, nil)
	if b.TxnID != a.TxnID {
		t.Fatal("second key did not join the transaction")
	}
	e.update(a, `{"balance":90}`)
	e.update(b, `{"balance":110}`)
	if r := e.release(a, false); r.status != 200 {
		t.Fatalf("release %d %s", r.status, r.body)
	}
	if p := e.publicGet("beta", "acct-b"); string(p.body) != `{"balance":110}` {
		t.Fatalf("second key not committed by the release of the first: %d %s", p.status, p.body)
	}
	// The second lease was released by the commit; releasing it again is a
	// no-op, and the decision is final.
	if r := e.release(b, false); r.status != 200 {
		t.Fatalf("second release: %d %s", r.status, r.body)
	}
	wantErr(t, e.release(b, true), 409, "txn_committed")
	wantErr(t, e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "acct-c", Owner: "o", TxnID: a.TxnID}), 409, "txn_committed")
	other := e.acquire(wire.AcquireRequest{Key: "acct-a", BlockSecs: -1}, nil)
	if other.FencingToken != a.FencingToken+1 {
		t.Fatalf("key not free after commit: %+v", other)
	}
}

func TestExpiredLeaseRollsBackItsTransaction(t *testing.T) {
	e := newEnv(t)
	a := e.acquire(wire.AcquireRequest{Key: "x1", TTLSeconds: 1}, nil)
	b := e.acquire(wire.AcquireRequest{Key: "x2", TTLSeconds: 30, TxnID: a.TxnID}, nil)
	e.update(a, `{"v":"a"}`)
	e.update(b, `{"v":"b"}`)
	testutil.WaitFor(t, 5*time.Second, "expiry to release the whole transaction", func() bool {
		var d wire.DescribeResponse
		e.do(http.MethodGet, "/v1/describe?key=x2", nil, "").json(t, &d)
		return d.LeaseID == ""
	})
	for _, k := range []string{"x1", "x2"} {
		if p := e.publicGet("default", k); p.status != 204 {
			t.Fatalf("%s has state after rollback: %d %s", k, p.status, p.body)
		}
	}
	wantErr(t, e.update(b, `{"v":"late"}`), 403, "lease_expired")
	wantErr(t, e.release(b, false), 409, "txn_rolled_back")
	if r := e.release(b, true); r.status != 200 {
		t.Fatalf("rollback after expiry: %d %s", r.status, r.body)
	}
}

func TestLeaseChecks(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "lc", TTLSeconds: 30}, nil)
	with := func(mod func(h map[string]string)) map[string]string {
		h := leaseHeaders(l)
		mod(h)
		return h
	}
	upd := func(h map[string]string, body string) resp { return e.do(http.MethodPost, "/v1/update"+q(l), h, body) }

	wantErr(t, upd(with(func(h map[string]string) { delete(h, wire.HeaderLeaseID) }), `{}`), 400, "missing_lease")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderLeaseID] = "bogus" }), `{}`), 400, "invalid_lease")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderLeaseID] = xid.New().String() }), `{}`), 403, "lease_required")
	wantErr(t, upd(with(func(h map[string]string) { delete(h, wire.HeaderTxnID) }), `{}`), 400, "missing_txn")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderTxnID] = xid.New().String() }), `{}`), 409, "txn_mismatch")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderFencingToken] = "7" }), `{}`), 403, "fencing_mismatch")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderFencingToken] = "x" }), `{}`), 400, "invalid_fencing_token")
	wantErr(t, upd(leaseHeaders(l), `{"a":`), 400, "invalid_body")
	wantErr(t, upd(leaseHeaders(l), "{\"a\":\"\xff\"}"), 400, "invalid_body")
	wantErr(t, upd(leaseHeaders(l), ``), 400, "missing_body")
	wantErr(t, upd(leaseHeaders(l), `{"big":"`+strings.Repeat("x", 1<<20)+`"}`), 413, "state_too_large")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderExpectedBytes] = "3" }), `{}`), 409, "expected_bytes_mismatch")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderExpectedBytes] = "-3" }), `{}`), 400, "invalid_expected_bytes")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderExpectedSHA256] = strings.Repeat("0", 64) }), `{}`), 409, "expected_sha256_mismatch")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderExpectedSHA256] = "abc" }), `{}`), 400, "invalid_expected_sha256")
	wantErr(t, e.do(http.MethodPost, "/v1/update?key=", leaseHeaders(l), `{}`), 400, "missing_key")

	// Compare-and-swap against the holder's view.
	r := upd(with(func(h map[string]string) { h[wire.HeaderIfVersion] = "0" }), `{"v":1}`)
	if r.status != 200 {
		t.Fatalf("conditional update: %d %s", r.status, r.body)
	}
	var u wire.UpdateResponse
	r.json(t, &u)
	env := wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderIfVersion] = "0" }), `{"v":2}`), 409, "version_conflict")
	if env["current_version"] != float64(1) || env["current_etag"] != u.NewStateETag {
		t.Fatalf("conflict envelope %v", env)
	}
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderIfVersion] = "one" }), `{"v":2}`), 400, "invalid_version")
	wantErr(t, upd(with(func(h map[string]string) { h[wire.HeaderIfStateETag] = "nope" }), `{"v":2}`), 409, "etag_mismatch")
	if r := upd(with(func(h map[string]string) {
		h[wire.HeaderIfVersion] = "1"
		h[wire.HeaderIfStateETag] = `"` + u.NewStateETag + `"`
	}), `{"v":3}`); r.status != 200 {
		t.Fatalf("chained conditional update: %d %s", r.status, r.body)
	}
	// None of the rejected writes changed the staged document.
	g := e.do(http.MethodPost, "/v1/get"+q(l), leaseHeaders(l), "")
	if string(g.body) != `{"v":3}` {
		t.Fatalf("staged document %s", g.body)
	}

	// Reads need a lease unless public.
	wantErr(t, e.do(http.MethodPost, "/v1/get"+q(l), nil, ""), 400, "missing_lease")
	// As in lockd, a public value that is not a boolean counts as false.
	wantErr(t, e.do(http.MethodPost, "/v1/get"+q(l)+"&public=maybe", nil, ""), 400, "missing_lease")
	wantErr(t, e.do(http.MethodPost, "/v1/get"+q(l)+"&public=1&stale=maybe", nil, ""), 400, "invalid_params")
	wantErr(t, e.do(http.MethodPost, "/v1/get"+q(l), with(func(h map[string]string) { h[wire.HeaderLeaseID] = xid.New().String() }), ""), 403, "lease_required")
	wantErr(t, e.do(http.MethodPost, "/v1/get?public=1", nil, ""), 400, "missing_key")

	// Keepalive needs the fencing token.
	ka := func(h map[string]string, body any) resp { return e.post("/v1/keepalive", h, body) }
	kreq := wire.KeepAliveRequest{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID, TTLSeconds: 60}
	wantErr(t, ka(nil, kreq), 400, "missing_fencing_token")
	wantErr(t, ka(map[string]string{wire.HeaderFencingToken: "0"}, kreq), 400, "invalid_fencing_token")
	wantErr(t, ka(map[string]string{wire.HeaderFencingToken: "2"}, kreq), 403, "fencing_mismatch")
	bad := kreq
	bad.LeaseID = xid.New().String()
	wantErr(t, ka(leaseHeaders(l), bad), 403, "lease_required")
	kr := ka(leaseHeaders(l), kreq)
	var k wire.KeepAliveResponse
	kr.json(t, &k)
	if kr.status != 200 || time.Until(time.Unix(k.ExpiresAt, 0)) < 55*time.Second {
		t.Fatalf("keepalive: %d %s", kr.status, kr.body)
	}

	// Release checks.
	rel := func(body any) resp { return e.post("/v1/release", nil, body) }
	wantErr(t, rel(wire.ReleaseRequest{Key: l.Key, LeaseID: l.LeaseID}), 400, "missing_txn")
	wantErr(t, rel(wire.ReleaseRequest{Key: l.Key, LeaseID: l.LeaseID, TxnID: "bad"}), 400, "invalid_txn")
	wantErr(t, rel(wire.ReleaseRequest{Key: l.Key, LeaseID: l.LeaseID, TxnID: xid.New().String()}), 409, "txn_mismatch")
	wantErr(t, rel(wire.ReleaseRequest{Key: l.Key, LeaseID: xid.New().String(), TxnID: l.TxnID}), 409, "lease_mismatch")
	wantErr(t, rel(wire.ReleaseRequest{LeaseID: l.LeaseID, TxnID: l.TxnID}), 400, "missing_key")
	if r := e.release(l, false); r.status != 200 {
		t.Fatalf("release %d %s", r.status, r.body)
	}
	if r := e.release(l, false); r.status != 200 {
		t.Fatalf("retried release %d %s", r.status, r.body)
	}
}

func TestProbesAndMetrics(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := e.do(http.MethodGet, p, nil, ""); r.status != 200 {
			t.Fatalf("%s: %d", p, r.status)
		}
	}
	e.acquire(wire.AcquireRequest{Key: "m", TTLSeconds: 30}, nil)
	go e.post("/v1/acquire", nil, wire.AcquireRequest{Key: "m", Owner: "w", BlockSecs: 2})
	metrics := func() string { return string(e.do(http.MethodGet, "/metrics", nil, "").body) }
	testutil.WaitFor(t, 5*time.Second, "waiter gauge", func() bool {
		return strings.Contains(metrics(), "raftlockd_lease_waiters 1")
	})
	block := chaingen.New("metrics").Fund(2, 2)
	if r := e.post("/v1/utxo/blocks/apply", nil, block); r.status != 200 {
		t.Fatalf("block: %d %s", r.status, r.body)
	}
	m := metrics()
	for _, want := range []string{
		"raftlockd_utxo_chain_height 1",
		"raftlockd_utxo_transactions 1",
		"raftlockd_utxo_outputs 2",
		`raftlockd_utxo_op_duration_seconds_bucket{op="apply"`,
		`raftlockd_utxo_op_items_bucket{op="apply"`,
		`raftlockd_http_requests_total{code="200",endpoint="/v1/acquire"}`,
		"raftlockd_http_request_seconds_bucket",
		"raftlockd_raft_apply_batch_entries_bucket",
		"raftlockd_raft_entry_commands_bucket",
		"raftlockd_raft_apply_batch_seconds_bucket",
		"raftlockd_leases_held 1",
		"raftlockd_raft_is_leader 1",
		"raftlockd_clock_offset_seconds 0", // one node: its own clock
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestGetEndpointsAnswerHEAD: a HEAD request, as load balancers' health
// checks often send (HAProxy's "option httpchk HEAD /readyz"), is answered
// as the GET would be, without the body; other methods still are not.
func TestGetEndpointsAnswerHEAD(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		r := e.do(http.MethodHead, p, nil, "")
		if r.status != http.StatusOK || len(r.body) != 0 {
			t.Errorf("HEAD %s: %d %q, want 200 without a body", p, r.status, r.body)
		}
	}
	// A snapshot's size, index and checksum, without its bytes.
	full := e.operator().do(http.MethodGet, "/v1/cluster/snapshot", nil, "")
	head := e.operator().do(http.MethodHead, "/v1/cluster/snapshot", nil, "")
	if head.status != http.StatusOK || len(head.body) != 0 || head.header.Get("Content-Length") != strconv.Itoa(len(full.body)) ||
		head.header.Get(wire.HeaderSnapshotSHA256) != full.header.Get(wire.HeaderSnapshotSHA256) {
		t.Errorf("HEAD /v1/cluster/snapshot: %d %v (%d bytes), want the GET's headers (%v) without its %d bytes",
			head.status, head.header, len(head.body), full.header, len(full.body))
	}
	wantErr(t, e.do(http.MethodPost, "/readyz", nil, ""), http.StatusMethodNotAllowed, "method_not_allowed")
	if allow := e.do(http.MethodPut, "/healthz", nil, "").header.Get("Allow"); allow != "GET, HEAD" {
		t.Errorf("Allow %q, want GET, HEAD", allow)
	}
}

func TestIdempotencyKeysAreScopedToTheRequest(t *testing.T) {
	e := newEnv(t)
	h := map[string]string{wire.HeaderIdempotencyKey: "same"}
	x := e.acquire(wire.AcquireRequest{Key: "x", Owner: "a", TTLSeconds: 30}, h)
	// The same idempotency key on another key, or by another owner, is
	// another request.
	y := e.acquire(wire.AcquireRequest{Key: "y", Owner: "a", TTLSeconds: 30, BlockSecs: -1}, h)
	if y.Key != "y" || y.LeaseID == x.LeaseID {
		t.Fatalf("acquire of y answered with %+v", y)
	}
	wantErr(t, e.post("/v1/acquire", h, wire.AcquireRequest{Key: "x", Owner: "b", BlockSecs: -1}), 409, "waiting")
	// A retried key-less acquire gets the key (and lease) of its first attempt.
	g1 := e.acquire(wire.AcquireRequest{Owner: "a", TTLSeconds: 30}, map[string]string{wire.HeaderIdempotencyKey: "gen"})
	g2 := e.acquire(wire.AcquireRequest{Owner: "a", TTLSeconds: 30}, map[string]string{wire.HeaderIdempotencyKey: "gen"})
	if g1.Key != g2.Key || g1.LeaseID != g2.LeaseID {
		t.Fatalf("retried key-less acquire: %+v vs %+v", g1, g2)
	}
	// A huge block is capped, not an overflow.
	if l := e.acquire(wire.AcquireRequest{Key: "free", Owner: "a", BlockSecs: 1 << 40}, nil); l.FencingToken != 1 {
		t.Fatalf("%+v", l)
	}
}

// The profiler is served only when asked for.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	off := newEnv(t).operator()
	if r := off.do(http.MethodGet, "/debug/pprof/", nil, ""); r.status != http.StatusNotFound {
		t.Fatalf("pprof without --pprof: %d %s", r.status, r.body)
	}
	cfg := testutil.Config(t, t.TempDir())
	cfg.Pprof = true
	srv := testutil.StartServer(t, cfg)
	on := envOf(t, srv).operator()
	r := on.do(http.MethodGet, "/debug/pprof/goroutine?debug=1", nil, "")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "goroutine profile") {
		t.Fatalf("pprof with --pprof: %d %.200s", r.status, r.body)
	}
}

// A rollback must name the height to roll back to: an absent or null
// to_height is refused, not a rollback of every block.
func TestUTXORollbackNeedsItsHeight(t *testing.T) {
	e := newEnv(t)
	if r := e.post("/v1/utxo/blocks/apply", nil, chaingen.New("rollback").Fund(1, 1)); r.status != 200 {
		t.Fatalf("block: %d %s", r.status, r.body)
	}
	for _, body := range []string{`{}`, `{"to_height":null}`} {
		wantErr(t, e.post("/v1/utxo/blocks/rollback", nil, body), http.StatusBadRequest, "invalid_body")
	}
	var st wire.UTXOStatus
	if r := e.do(http.MethodGet, "/v1/utxo/status", nil, ""); r.status != 200 {
		t.Fatalf("status: %d %s", r.status, r.body)
	} else {
		r.json(t, &st)
	}
	if st.ChainHeight != 1 || st.BlocksRolledBack != 0 {
		t.Fatalf("a refused rollback changed the chain: height %d, %d blocks rolled back", st.ChainHeight, st.BlocksRolledBack)
	}
	if r := e.post("/v1/utxo/blocks/rollback", nil, `{"to_height":0}`); r.status != 200 {
		t.Fatalf("rollback to 0: %d %s", r.status, r.body)
	}
}

// A prune pass takes no parameters: an empty body or {} runs it, anything
// else is invalid_body, as on every other JSON endpoint.
func TestUTXOPruneTakesNoBody(t *testing.T) {
	e := newEnv(t)
	for _, body := range []string{"", "{}"} {
		if r := e.do(http.MethodPost, "/v1/utxo/prune", nil, body); r.status != 200 {
			t.Fatalf("prune with %q: %d %s", body, r.status, r.body)
		}
	}
	for _, body := range []string{"garbage", `{"limit":5}`, "[]", "{} {}"} {
		wantErr(t, e.do(http.MethodPost, "/v1/utxo/prune", nil, body), http.StatusBadRequest, "invalid_body")
	}
}

// A correlation id is echoed up to 128 bytes; a longer one is replaced.
func TestCorrelationIDLimit(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		sent string
		echo bool
	}{{strings.Repeat("c", 128), true}, {strings.Repeat("c", 129), false}} {
		got := e.do(http.MethodGet, "/healthz", map[string]string{wire.HeaderCorrelationID: c.sent}, "").header.Get(wire.HeaderCorrelationID)
		if (got == c.sent) != c.echo || got == "" {
			t.Fatalf("sent %d bytes, answered %q", len(c.sent), got)
		}
	}
}
