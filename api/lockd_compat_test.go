package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// lockdSession replays, request for request, what lockd's Go client
// (pkt.systems/lockd/client) sends and reads for acquire -> get -> update ->
// keepalive -> release: the same methods, paths, query parameters, headers
// and JSON bodies, and the same success rules (exact status codes, fencing
// token taken from the acquire body and refreshed from X-Fencing-Token,
// conditional updates chained from the previous response).
type lockdSession struct {
	t         *testing.T
	hc        *http.Client
	base      string
	namespace string
	key       string
	leaseID   string
	txnID     string
	token     string
	version   int64
	etag      string
}

func (s *lockdSession) send(req *http.Request) (*http.Response, []byte) {
	s.t.Helper()
	res, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, body
}

func (s *lockdSession) keyQuery() string {
	return "?" + url.Values{"key": {s.key}, "namespace": {s.namespace}}.Encode()
}

// acquire: lockd sends its AcquireRequest struct with namespace always set,
// block_seconds 0 (wait) and no X-Txn-ID for a new transaction; any status
// below 300 is success and the body is an AcquireResponse.
func (s *lockdSession) acquire(owner string, ttl int) {
	s.t.Helper()
	body := `{"namespace":"` + s.namespace + `","key":"` + s.key + `","ttl_seconds":` + strconv.Itoa(ttl) +
		`,"owner":"` + owner + `","block_seconds":0}`
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/acquire", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, raw := s.send(req)
	if res.StatusCode >= 300 {
		s.t.Fatalf("acquire: %d %s", res.StatusCode, raw)
	}
	var out struct {
		Namespace     string `json:"namespace"`
		LeaseID       string `json:"lease_id"`
		TxnID         string `json:"txn_id"`
		Key           string `json:"key"`
		Owner         string `json:"owner"`
		ExpiresAt     int64  `json:"expires_at_unix"`
		Version       int64  `json:"version"`
		StateETag     string `json:"state_etag"`
		FencingToken  int64  `json:"fencing_token"`
		RetryAfter    int64  `json:"retry_after_seconds"`
		CorrelationID string `json:"correlation_id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		s.t.Fatalf("acquire body: %v", err)
	}
	// lockd only keeps a non-zero token; without one it cannot get, update or release.
	if out.FencingToken == 0 || out.LeaseID == "" || out.TxnID == "" || out.ExpiresAt == 0 {
		s.t.Fatalf("acquire response unusable by lockd: %s", raw)
	}
	s.leaseID, s.txnID, s.token = out.LeaseID, out.TxnID, strconv.FormatInt(out.FencingToken, 10)
	s.version, s.etag = out.Version, out.StateETag
}

// get: POST with an empty body, lease headers, 200 or 204.
func (s *lockdSession) get() (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/get"+s.keyQuery(), http.NoBody)
	req.Header.Set("X-Lease-ID", s.leaseID)
	req.Header.Set("X-Fencing-Token", s.token)
	res, raw := s.send(req)
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusNoContent {
		s.t.Fatalf("get: %d %s", res.StatusCode, raw)
	}
	if tok := res.Header.Get("X-Fencing-Token"); tok != "" {
		s.token = tok
	}
	if v := res.Header.Get("X-Key-Version"); v != "" {
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			s.t.Fatalf("X-Key-Version %q", v)
		}
	}
	return res.StatusCode, raw
}

// update: raw JSON body; the previous response's version and etag are sent
// as conditions; exactly 200 is success.
func (s *lockdSession) update(doc string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/update"+s.keyQuery(), strings.NewReader(doc))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Lease-ID", s.leaseID)
	req.Header.Set("X-Fencing-Token", s.token)
	req.Header.Set("X-Txn-ID", s.txnID)
	if s.etag != "" {
		req.Header.Set("X-If-State-ETag", s.etag)
	}
	if s.version > 0 {
		req.Header.Set("X-If-Version", strconv.FormatInt(s.version, 10))
	}
	res, raw := s.send(req)
	if res.StatusCode != http.StatusOK {
		s.t.Fatalf("update: %d %s", res.StatusCode, raw)
	}
	var out struct {
		NewVersion   int64           `json:"new_version"`
		NewStateETag string          `json:"new_state_etag"`
		Bytes        int64           `json:"bytes"`
		Metadata     json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		s.t.Fatalf("update body: %v", err)
	}
	if tok := res.Header.Get("X-Fencing-Token"); tok != "" {
		s.token = tok
	}
	s.version, s.etag = out.NewVersion, out.NewStateETag
}

// keepalive: JSON body with the lease, X-Fencing-Token and X-Txn-ID headers.
func (s *lockdSession) keepalive(ttl int) {
	s.t.Helper()
	body := `{"namespace":"` + s.namespace + `","key":"` + s.key + `","lease_id":"` + s.leaseID +
		`","ttl_seconds":` + strconv.Itoa(ttl) + `,"txn_id":"` + s.txnID + `"}`
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/keepalive", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Fencing-Token", s.token)
	req.Header.Set("X-Txn-ID", s.txnID)
	res, raw := s.send(req)
	var out struct {
		ExpiresAt int64 `json:"expires_at_unix"`
	}
	if res.StatusCode >= 300 || json.Unmarshal(raw, &out) != nil || out.ExpiresAt == 0 {
		s.t.Fatalf("keepalive: %d %s", res.StatusCode, raw)
	}
}

// release: X-Fencing-Token header, txn_id always present in the body,
// {"released":true} expected.
func (s *lockdSession) release(rollback bool) {
	s.t.Helper()
	body := `{"namespace":"` + s.namespace + `","key":"` + s.key + `","lease_id":"` + s.leaseID + `","txn_id":"` + s.txnID + `"`
	if rollback {
		body += `,"rollback":true`
	}
	body += "}"
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/release", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Fencing-Token", s.token)
	res, raw := s.send(req)
	if res.StatusCode >= 300 || !strings.Contains(string(raw), `"released":true`) {
		s.t.Fatalf("release: %d %s", res.StatusCode, raw)
	}
}

func TestLockdClientTranscript(t *testing.T) {
	e := newEnv(t)
	s := &lockdSession{t: t, hc: e.hc, base: e.url, namespace: "default", key: "orders/alpha"}
	s.acquire("worker-1", 30)
	if status, _ := s.get(); status != http.StatusNoContent {
		t.Fatalf("get of a fresh key: %d", status)
	}
	s.update(`{"status":"pending","items":3}`)
	s.update(`{"status":"ready","items":3}`) // chained: X-If-Version and X-If-State-ETag from the first update
	if status, body := s.get(); status != http.StatusOK || string(body) != `{"status":"ready","items":3}` {
		t.Fatalf("get after update: %d %s", status, body)
	}
	s.keepalive(60)
	s.release(false)

	// Describe answers exactly 200 with lockd's DescribeResponse.
	res, raw := s.send(mustReq(http.MethodGet, e.url+"/v1/describe"+s.keyQuery()))
	var d struct {
		Namespace string `json:"namespace"`
		Key       string `json:"key"`
		Version   int64  `json:"version"`
		StateETag string `json:"state_etag"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &d) != nil || d.Version != 1 || d.Key != s.key {
		t.Fatalf("describe: %d %s", res.StatusCode, raw)
	}

	// A second session sees the committed state and can remove it.
	s2 := &lockdSession{t: t, hc: e.hc, base: e.url, namespace: "default", key: "orders/alpha"}
	s2.acquire("worker-2", 30)
	if s2.version != 1 || s2.etag != d.StateETag {
		t.Fatalf("second acquire does not carry the committed version: %d %q", s2.version, s2.etag)
	}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/remove"+s2.keyQuery(), http.NoBody)
	req.Header.Set("X-Lease-ID", s2.leaseID)
	req.Header.Set("X-Fencing-Token", s2.token)
	req.Header.Set("X-Txn-ID", s2.txnID)
	req.Header.Set("X-If-State-ETag", s2.etag)
	req.Header.Set("X-If-Version", strconv.FormatInt(s2.version, 10))
	if res, raw := s2.send(req); res.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"removed":true`) {
		t.Fatalf("remove: %d %s", res.StatusCode, raw)
	}
	s2.release(false)
	if r := e.publicGet("default", "orders/alpha"); r.status != http.StatusNoContent {
		t.Fatalf("state after committed removal: %d %s", r.status, r.body)
	}

	// lockd treats a release of a lease that is gone as done.
	s2.release(false)
}

func mustReq(method, u string) *http.Request {
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		panic(err)
	}
	return req
}
