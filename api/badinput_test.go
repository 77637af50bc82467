package api_test

import (
	"net/http"
	"testing"
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
