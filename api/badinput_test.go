package api_test

import (
	"net/http"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

// TestMethodsOfTheTrustListAndMetrics: the trust list (GET and POST) and
// /metrics are GET endpoints like the others: HEAD is answered as the GET,
// without the body, and a method neither serves is 405 method_not_allowed
// naming what is allowed, not served as a GET.
func TestMethodsOfTheTrustListAndMetrics(t *testing.T) {
	op := newEnv(t).operator()
	for _, p := range []string{"/v1/tc/trust", "/metrics"} {
		if r := op.do(http.MethodHead, p, nil, ""); r.status != http.StatusOK || len(r.body) != 0 {
			t.Errorf("HEAD %s: %d %s, want 200 without a body", p, r.status, r.body)
		}
	}
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/v1/tc/trust", "GET, HEAD, POST"},
		{http.MethodPost, "/metrics", "GET, HEAD"},
		{http.MethodDelete, "/metrics", "GET, HEAD"},
	} {
		r := op.do(c.method, c.path, nil, "")
		if r.status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want 405 (body %.80q)", c.method, c.path, r.status, r.body)
			continue
		}
		wantErr(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		if got := r.header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
}

// TestMalformedQueryIsRefused: a query string that does not parse (a bad
// percent escape, a semicolon) is 400 invalid_params, not read as if the
// malformed parameter were absent, which would read, or lock, the key in
// the default namespace instead of the one named.
func TestMalformedQueryIsRefused(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(wire.AcquireRequest{Key: "mq", TTLSeconds: 30}, nil)
	e.update(l, `{"ns":"default"}`)
	e.release(l, false)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/get?public=1&namespace=other%ZZ&key=mq", ""},
		{http.MethodPost, "/v1/get?public=1&namespace=other;x&key=mq", ""},
		{http.MethodGet, "/v1/describe?namespace=oth%er&key=mq", ""},
		{http.MethodPost, "/v1/acquire?namespace=other%ZZ&key=mq", `{"owner":"o","block_seconds":-1}`},
	} {
		wantErr(t, e.do(c.method, c.path, nil, c.body), http.StatusBadRequest, "invalid_params")
	}
	var d wire.DescribeResponse
	e.do(http.MethodGet, "/v1/describe?key=mq", nil, "").json(t, &d)
	if d.LeaseID != "" {
		t.Fatalf("an acquire with a malformed query took default/mq: %+v", d)
	}
}
