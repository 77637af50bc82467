package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/rs/xid"
	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/api"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

// fuzzEndpoints are the routes FuzzHTTP aims at; the fuzzed method
// replaces the route's own when set.
var fuzzEndpoints = []struct{ method, path string }{
	{"GET", "/healthz"}, {"GET", "/readyz"}, {"GET", "/metrics"},
	{"POST", "/v1/acquire"}, {"POST", "/v1/keepalive"}, {"POST", "/v1/release"}, {"POST", "/v1/get"},
	{"POST", "/v1/update"}, {"POST", "/v1/remove"}, {"GET", "/v1/describe"},
	{"POST", "/v1/txn/decide"}, {"POST", "/v1/txn/replay"}, {"GET", "/v1/txn/status"},
	{"POST", "/v1/txn/prepare"}, {"POST", "/v1/txn/commit"}, {"POST", "/v1/txn/rollback"},
	{"POST", "/v1/tc/rm/register"}, {"POST", "/v1/tc/rm/unregister"}, {"GET", "/v1/tc/rm/list"},
	{"GET", "/v1/tc/leader"}, {"GET", "/v1/tc/cluster/list"}, {"POST", "/v1/tc/cluster/announce"},
	{"POST", "/v1/tc/cluster/leave"}, {"POST", "/v1/tc/trust"},
	{"POST", "/v1/queue/enqueue"}, {"POST", "/v1/queue/dequeue"}, {"POST", "/v1/queue/dequeueWithState"},
	{"POST", "/v1/queue/subscribe"}, {"POST", "/v1/queue/subscribeWithState"}, {"POST", "/v1/queue/ack"},
	{"POST", "/v1/queue/nack"}, {"POST", "/v1/queue/extend"}, {"POST", "/v1/queue/stats"},
	{"GET", "/v1/cluster/status"}, {"GET", "/v1/cluster/members"}, {"POST", "/v1/cluster/leave"},
	{"POST", "/v1/cluster/remove-peer"}, {"GET", "/v1/cluster/snapshot"}, {"POST", "/v1/cluster/snapshot"},
	{"POST", "/v1/auth/revoke"}, {"GET", "/v1/auth/revoked"}, {"GET", "/v1/nowhere"},
	{"POST", "/v1/utxo/create"}, {"POST", "/v1/utxo/spend"}, {"POST", "/v1/utxo/unspend"}, {"POST", "/v1/utxo/freeze"},
	{"POST", "/v1/utxo/unfreeze"}, {"POST", "/v1/utxo/reassign"}, {"POST", "/v1/utxo/conflicting"},
	{"POST", "/v1/utxo/locked"}, {"POST", "/v1/utxo/preserve"}, {"POST", "/v1/utxo/mined"},
	{"POST", "/v1/utxo/longest-chain"}, {"POST", "/v1/utxo/height"}, {"GET", "/v1/utxo/tx"},
	{"POST", "/v1/utxo/blocks/apply"}, {"POST", "/v1/utxo/blocks/rollback"}, {"POST", "/v1/utxo/prune"},
	{"GET", "/v1/utxo/status"}, {"GET", "/ui/status"},
}

// unavailable are the codes a 5xx may carry: the node cannot serve now
// (503), or another island did not answer (502, 503 txn_unreachable).
// Everything else with a 5xx is a bug.
var unavailable = map[string]bool{
	errcode.NoLeader.Code: true, errcode.NotLeader.Code: true, errcode.Unavailable.Code: true,
	errcode.ShuttingDown.Code: true, errcode.NotReady.Code: true, errcode.TxnUnreachable.Code: true,
	errcode.TxnFanoutFailed.Code: true, errcode.TCRMReplication.Code: true,
}

// decisions are the 409s that report the outcome of a transaction the
// request itself decided: a pending decision or prepare that finds a key
// held by another transaction rolls its transaction back for good
// (txn_lock_conflict, remembered so that a retry fails at once), and a
// commit of a transaction whose lease expired rolls it back
// (txn_rolled_back). These answers change the state by design.
var decisions = map[string]map[string]bool{
	"/v1/txn/decide":  {errcode.TxnLockConflict.Code: true, errcode.TxnRolledBack.Code: true},
	"/v1/txn/prepare": {errcode.TxnLockConflict.Code: true, errcode.TxnRolledBack.Code: true},
	"/v1/txn/commit":  {errcode.TxnLockConflict.Code: true, errcode.TxnRolledBack.Code: true},
	"/v1/release":     {errcode.TxnRolledBack.Code: true},
}

// httpFuzz is one real single-node server per fuzzing process, with a held
// lease and a delivered message whose identifiers the inputs name through
// placeholders ($LEASE, $TXN, $TOKEN, $MSG, ...).
type httpFuzz struct {
	srv       *server.Server
	hc        *http.Client
	dir       string
	vars      *strings.Replacer
	retention int64
}

func startHTTPFuzz(f *testing.F) *httpFuzz {
	cfg := testutil.Config(f, f.TempDir())
	cfg.DisableMTLS = true
	// Waiting acquires and dequeues end within 100ms: the fuzzer reruns an
	// input many times while it minimizes it, and an input that waits on a
	// key an earlier input holds waits on every run.
	cfg.AcquireBlock = 100 * time.Millisecond
	cfg.MaxStateBytes, cfg.MaxPayloadBytes = 4096, 4096
	cfg.TCFanoutTimeout, cfg.TCFanoutAttempts = 200*time.Millisecond, 1
	cfg.TCFanoutBaseDelay, cfg.TCFanoutMaxDelay = 10*time.Millisecond, 10*time.Millisecond
	s := &httpFuzz{srv: testutil.StartServer(f, cfg), hc: &http.Client{Transport: &http.Transport{}}, dir: f.TempDir(),
		retention: cfg.TxnRetention.Milliseconds()}
	f.Cleanup(s.hc.CloseIdleConnections)
	setup := func(path, contentType string, body []byte, out any) {
		resp, err := s.hc.Post(s.srv.URL()+path, contentType, bytes.NewReader(body))
		if err != nil {
			f.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			f.Fatalf("%s: %d %s", path, resp.StatusCode, raw)
		}
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				f.Fatalf("%s: %v", path, err)
			}
		}
	}
	// The island registers itself in its RM registry within seconds of
	// starting; doing it now keeps that from happening while inputs run.
	testutil.WaitFor(f, 10*time.Second, "the backend hash", func() bool { return s.srv.Node().BackendHash() != "" })
	mine, _, err := s.srv.Node().Endpoints()
	if err != nil || len(mine) != 1 {
		f.Fatalf("endpoints %v: %v", mine, err)
	}
	setup("/v1/tc/rm/register", "application/json",
		[]byte(`{"backend_hash":"`+s.srv.Node().BackendHash()+`","endpoint":"`+mine[0]+`"}`), nil)
	var lease wire.AcquireResponse
	setup("/v1/acquire", "application/json", []byte(`{"key":"fz-held","owner":"fuzz","ttl_seconds":3600}`), &lease)
	for _, p := range []string{"first", "second"} {
		ct, body := enqueueBody(f, `{"queue":"fzq"}`, p)
		setup("/v1/queue/enqueue", ct, body, nil)
	}
	dq, err := s.hc.Post(s.srv.URL()+"/v1/queue/dequeue", "application/json",
		strings.NewReader(`{"queue":"fzq","owner":"fuzz","visibility_timeout_seconds":3600,"wait_seconds":-1}`))
	if err != nil {
		f.Fatal(err)
	}
	deliveries := readMultipart(f, dq)
	if len(deliveries) == 0 {
		f.Fatal("no delivery to fuzz with")
	}
	var meta wire.DequeueResponse
	if err := json.Unmarshal(deliveries[0]["meta"], &meta); err != nil || meta.Message == nil {
		f.Fatalf("delivery meta %q: %v", deliveries[0]["meta"], err)
	}
	m := meta.Message
	s.vars = strings.NewReplacer("$LEASE", lease.LeaseID, "$TXN", lease.TxnID, "$TOKEN", fmt.Sprint(lease.FencingToken),
		"$KEY", "fz-held", "$QUEUE", "fzq", "$MSG", m.MessageID, "$QLEASE", m.LeaseID, "$QTOKEN", fmt.Sprint(m.FencingToken),
		"$SELF", s.srv.Node().BackendHash(), "$EP", s.srv.URL(), "$NODE", s.srv.Node().ID())
	return s
}

// enqueueBody is a multipart enqueue body: a meta part and a payload part.
func enqueueBody(t testing.TB, meta, payload string) (string, []byte) {
	t.Helper()
	b := "fuzzboundary"
	body := "--" + b + "\r\nContent-Disposition: form-data; name=\"meta\"\r\nContent-Type: application/json\r\n\r\n" + meta +
		"\r\n--" + b + "\r\nContent-Disposition: form-data; name=\"payload\"\r\nContent-Type: text/plain\r\n\r\n" + payload +
		"\r\n--" + b + "--\r\n"
	return "multipart/form-data; boundary=" + b, []byte(body)
}

// readMultipart reads a delivery answer into its parts, by part name.
func readMultipart(t testing.TB, resp *http.Response) []map[string][]byte {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dequeue: %d %s", resp.StatusCode, raw)
	}
	_, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	r := multipart.NewReader(bytes.NewReader(raw), params["boundary"])
	var out []map[string][]byte
	for {
		p, err := r.NextPart()
		if err != nil {
			return out
		}
		b, _ := io.ReadAll(p)
		if p.FormName() == wire.PartMeta {
			out = append(out, map[string][]byte{})
		}
		if len(out) > 0 {
			out[len(out)-1][p.FormName()] = b
		}
	}
}

func (s *httpFuzz) subst(in string) string {
	out := s.vars.Replace(in)
	for strings.Contains(out, "$XID") {
		out = strings.Replace(out, "$XID", xid.New().String(), 1)
	}
	return out
}

// handled counts the requests the API finished (its handlers return before
// the count moves).
func (s *httpFuzz) handled(t *testing.T) float64 {
	t.Helper()
	families, err := s.srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range families {
		if mf.GetName() == "raftlockd_http_requests_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// stateCopy is the replicated state at one moment, and what could change it
// without any request: deadlines the sweeper acts on, decisions the
// resolver finishes, the island's own registry entry it keeps current.
type stateCopy struct {
	raw       []byte
	deadline  int64 // earliest sweep deadline, Unix ms; 0: none
	doubt     int64 // earliest in-doubt transaction to resolve; 0: none
	resolving bool  // decisions to fan out or resolve through this island's own API
	registry  bool  // this island's registry entry differs from its members
	// forgettable names the key records the leader's forgetter may
	// delete meanwhile, as entries names them.
	forgettable map[string]bool
}

type memSink struct{ bytes.Buffer }

func (m *memSink) ID() string    { return "fuzz" }
func (m *memSink) Cancel() error { return nil }
func (m *memSink) Close() error  { return nil }

var _ raft.SnapshotSink = (*memSink)(nil)

// capture copies the state. What could change it in the background is
// read just before and just after the copy, so that work falling due while
// the copy is made is seen either way.
func (s *httpFuzz) capture(t *testing.T) stateCopy {
	t.Helper()
	f := s.srv.Node().FSM()
	var c stateCopy
	s.pending(&c)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	err = snap.Persist(&sink)
	snap.Release()
	if err != nil {
		t.Fatal(err)
	}
	c.raw = sink.Bytes()
	s.pending(&c)
	return c
}

// pending adds to c what the sweeper, the resolver and the forgetter have
// to do.
func (s *httpFuzz) pending(c *stateCopy) {
	earliest := func(have *int64, when int64, ok bool) {
		if ok && (*have == 0 || max(when, 1) < *have) {
			*have = max(when, 1)
		}
	}
	f := s.srv.Node().FSM()
	when, ok := f.NextDeadline(s.retention)
	earliest(&c.deadline, when, ok)
	self := s.srv.Node().BackendHash()
	mine, _, _ := s.srv.Node().Endpoints()
	_ = f.View(func(v *fsm.View) error {
		when, ok := v.NextDoubt()
		earliest(&c.doubt, when, ok)
		pending := false
		v.FanoutEach(func(string) bool { pending = true; return false })
		v.DoubtEach(1<<62, func(string) bool { pending = true; return false })
		keys, _ := v.ForgettableKeys(nil, 1<<20, 1<<30)
		for _, k := range keys {
			if c.forgettable == nil {
				c.forgettable = map[string]bool{}
			}
			c.forgettable[fmt.Sprintf("keys/%q", k.Namespace+"\x00"+k.Key)] = true
		}
		rms := v.RMs()
		if _, ok := rms[self]; !ok {
			c.registry = true
		}
		for backend, e := range rms {
			if backend == self {
				c.registry = c.registry || !slices.Equal(slices.Sorted(slices.Values(e.Endpoints)), mine)
				continue
			}
			for _, ep := range e.Endpoints {
				if pending && slices.Contains(mine, strings.TrimRight(ep, "/")) {
					c.resolving = true
				}
			}
		}
		return nil
	})
}

// quiet reports whether nothing but the request could have changed the
// state between start and end.
func (c stateCopy) quiet(start, end time.Time) bool {
	const margin = 500 * time.Millisecond
	due := func(at int64) bool { return at != 0 && at <= end.Add(margin).UnixMilli() }
	return !due(c.deadline) && !due(c.doubt) && !c.resolving && !c.registry && start.Before(end)
}

// entries reads every bucket of a state file copy but the meta bucket (the
// applied index and the clock move with every entry, accepted or not).
func (s *httpFuzz) entries(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	path := filepath.Join(s.dir, "copy.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]string{}
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			name := fmt.Sprintf("%s/%q", prefix, k)
			if nested := b.Bucket(k); v == nil && nested != nil {
				return walk(name, nested)
			}
			out[name] = string(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if string(name) == "meta" {
				return nil
			}
			return walk(string(name), b)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// changes lists what differs between two states, a few entries at most.
func changes(before, after map[string]string) []string {
	var out []string
	for k, v := range after {
		if w, ok := before[k]; !ok || w != v {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, w, v))
		}
	}
	for k, w := range before {
		if _, ok := after[k]; !ok {
			out = append(out, fmt.Sprintf("%s: %q removed", k, w))
		}
	}
	slices.Sort(out)
	return out[:min(len(out), 10)]
}

// validHeader reports whether a client can send the header as it is, and
// whether it is one the request's framing leaves to the client.
func validHeader(k, v string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	switch http.CanonicalHeaderKey(k) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "Upgrade", "Te", "Trailer",
		"Keep-Alive", "Proxy-Connection", "Http2-Settings":
		return false
	}
	return true
}

// requestTarget percent-encodes what cannot appear in a request line as it
// is, and keeps everything else (malformed escapes included) for the server
// to judge.
func requestTarget(q string) string {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if c := q[i]; c <= ' ' || c >= 0x7f || c == '#' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func validMethod(m string) bool {
	if m == "" || m == http.MethodConnect {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// FuzzHTTP sends arbitrary requests to every endpoint of a real node:
// method, query, headers and body are fuzzed. Nothing panics; no answer is
// a 5xx other than the availability codes (unavailable); every 4xx is a
// JSON error envelope whose stable code maps to its status; and a request
// answered 4xx changes no replicated state (compared when nothing else
// could have changed it meanwhile).
func FuzzHTTP(f *testing.F) {
	ep := func(path string) uint8 {
		for i, e := range fuzzEndpoints {
			if e.path == path {
				return uint8(i)
			}
		}
		f.Fatalf("no endpoint %s", path)
		return 0
	}
	ctJSON := "Content-Type: application/json\n"
	lease := "X-Lease-ID: $LEASE\nX-Txn-ID: $TXN\nX-Fencing-Token: $TOKEN\n"
	for _, s := range []struct {
		path, method, query, headers, body string
	}{
		{"/healthz", "", "", "", ""},
		{"/readyz", "POST", "", "", ""},
		{"/v1/acquire", "", "", ctJSON, `{"key":"k1","owner":"o","ttl_seconds":5}`},
		{"/v1/acquire", "", "namespace=Bad!&key=k", ctJSON, `{"owner":"o","ttl_seconds":5}`},
		{"/v1/acquire", "", "", ctJSON + "X-Idempotency-Key: a\tb\nX-Raftlockd-Timeout: 1ns\n", `{"key":"$KEY","owner":"o","block_seconds":1}`},
		{"/v1/acquire", "", "", ctJSON, `{"key":"$KEY","owner":"o","ttl_seconds":-1,"if_not_exists":true}`},
		{"/v1/acquire", "", "", ctJSON, `{"key":"k1","owner":"o"} trailing`},
		{"/v1/keepalive", "", "", ctJSON + "X-Fencing-Token: $TOKEN\n", `{"key":"$KEY","lease_id":"$LEASE","ttl_seconds":3600,"txn_id":"$TXN"}`},
		{"/v1/keepalive", "", "", ctJSON + "X-Fencing-Token: 0x1\n", `{"key":"$KEY","lease_id":"$LEASE"}`},
		{"/v1/release", "", "", ctJSON + "X-Fencing-Token: 999\n", `{"key":"$KEY","lease_id":"$LEASE","txn_id":"$TXN","rollback":true}`},
		{"/v1/get", "", "key=$KEY", lease, ""},
		{"/v1/get", "", "key=$KEY&public=1&stale=maybe", "", ""},
		{"/v1/update", "", "key=$KEY", lease + "X-If-Version: 0\n", `{"v":1}`},
		{"/v1/update", "", "key=$KEY", lease + "X-If-Version: -1\nX-Expected-SHA256: zz\n", `{"v":1}`},
		{"/v1/update", "", "key=$KEY", lease + "X-Expected-Bytes: 2\nX-If-State-ETag: nope\n", `{"v":"longer than two"}`},
		{"/v1/update", "", "key=$KEY", lease, `{"v":` + strings.Repeat("[", 5000)},
		{"/v1/remove", "", "key=$KEY", lease + "X-If-Version: 99\n", ""},
		{"/v1/describe", "", "key=$KEY&stale=1", "", ""},
		{"/v1/describe", "DELETE", "key=%zz", "", ""},
		{"/v1/txn/decide", "", "", ctJSON, `{"txn_id":"$XID","state":"commit","participants":[{"key":"k2"}]}`},
		{"/v1/txn/decide", "", "", ctJSON, `{"txn_id":"$TXN","state":"rollback"}`},
		{"/v1/txn/decide", "", "", ctJSON, `{"txn_id":"nope","state":"maybe","expires_at_unix":-5}`},
		{"/v1/txn/replay", "", "", ctJSON, `{"txn_id":"$TXN"}`},
		{"/v1/txn/status", "", "txn_id=$TXN", "", ""},
		{"/v1/txn/prepare", "", "", ctJSON, `{"txn_id":"$XID","state":"pending","tc_backend_hash":"other","tc_term":1,"target_backend_hash":"$SELF","participants":[{"key":"k3","backend_hash":"$SELF"}]}`},
		{"/v1/txn/commit", "", "", ctJSON, `{"txn_id":"$XID","state":"rollback"}`},
		{"/v1/txn/rollback", "", "", ctJSON, `{"txn_id":"$TXN","tc_backend_hash":"$SELF","tc_term":99}`},
		{"/v1/tc/rm/register", "", "", ctJSON, `{"backend_hash":"","endpoint":"ftp://x"}`},
		{"/v1/tc/rm/unregister", "", "", ctJSON, `{"backend_hash":"a/b","endpoint":"http://127.0.0.1:1"}`},
		{"/v1/tc/rm/list", "", "", "", ""},
		{"/v1/tc/leader", "", "", "", ""},
		{"/v1/tc/cluster/announce", "", "", ctJSON, `{"self_endpoint":"http://127.0.0.1:1"}`},
		{"/v1/tc/cluster/leave", "", "", ctJSON, `{"self_endpoint":"$EP"}`},
		{"/v1/tc/trust", "GET", "", "", ""},
		{"/v1/queue/enqueue", "", "", "Content-Type: multipart/form-data; boundary=fuzzboundary\n",
			"--fuzzboundary\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"queue\":\"fzq2\",\"attributes\":{\"a\":1}}\r\n" +
				"--fuzzboundary\r\nContent-Disposition: form-data; name=\"payload\"\r\n\r\npayload\r\n--fuzzboundary--\r\n"},
		{"/v1/queue/enqueue", "", "queue=fzq2", "Content-Type: multipart/related; boundary=" + strings.Repeat("b", 200) + "\n", "--b\r\n"},
		{"/v1/queue/enqueue", "", "", "Content-Type: text/plain\n", "x"},
		{"/v1/queue/dequeue", "", "", ctJSON, `{"queue":"fzq","owner":"o","wait_seconds":-1}`},
		{"/v1/queue/dequeueWithState", "", "include_state=1", ctJSON, `{"queue":"fzq","owner":"o","wait_seconds":-1,"txn_id":"$TXN"}`},
		{"/v1/queue/subscribe", "", "", ctJSON, `{"queue":"fzq2","owner":"o","wait_seconds":1}`},
		{"/v1/queue/subscribeWithState", "", "include_state=yes", ctJSON, `{"queue":"fzq2","owner":"o","wait_seconds":-2}`},
		{"/v1/queue/ack", "", "", ctJSON, `{"queue":"$QUEUE","message_id":"$MSG","lease_id":"$QLEASE","meta_etag":"\"1\"","fencing_token":2}`},
		{"/v1/queue/nack", "", "", ctJSON, `{"queue":"$QUEUE","message_id":"$MSG","lease_id":"$QLEASE","fencing_token":$QTOKEN,"intent":"later"}`},
		{"/v1/queue/extend", "", "", ctJSON, `{"queue":"$QUEUE","message_id":"$MSG","lease_id":"$QLEASE","fencing_token":$QTOKEN,"extend_by_seconds":-3}`},
		{"/v1/queue/stats", "", "stale=1", ctJSON, `{"queue":"$QUEUE"}`},
		{"/v1/cluster/status", "", "", "", ""},
		{"/v1/cluster/leave", "", "", ctJSON, `{"x":1}`},
		{"/v1/cluster/remove-peer", "", "", ctJSON, `{"id":"$NODE"}`},
		{"/v1/cluster/snapshot", "POST", "", "Content-Type: application/octet-stream\n", "not a snapshot"},
		{"/v1/cluster/snapshot", "PUT", "", "", ""},
		{"/v1/auth/revoke", "", "", ctJSON, `{"serial":""}`},
		{"/v1/nowhere", "PATCH", "a=b", "X-Correlation-Id: " + strings.Repeat("c", 200) + "\n", ""},
		{"/v1/utxo/create", "", "", ctJSON, `{"txid":"` + strings.Repeat("a", 64) + `","outputs":[{"vout":0,"utxo_hash":"` +
			strings.Repeat("b", 64) + `","satoshis":1}]}`},
		{"/v1/utxo/create", "", "", ctJSON, `{"txid":"` + strings.Repeat("c", 64) + `","outputs":[{"vout":0,"utxo_hash":"x","satoshis":1}]}`},
		{"/v1/utxo/spend", "", "", ctJSON, `{"spends":[{"txid":"` + strings.Repeat("a", 64) + `","vout":0,"utxo_hash":"` +
			strings.Repeat("b", 64) + `","spending_txid":"` + strings.Repeat("d", 64) + `","vin":0}]}`},
		{"/v1/utxo/spend", "", "", ctJSON, `{"spends":[{"txid":"` + strings.Repeat("e", 64) + `","vout":0,"utxo_hash":"` +
			strings.Repeat("b", 64) + `","spending_txid":"` + strings.Repeat("d", 64) + `","vin":0}],"txn_id":"$XID"}`},
		{"/v1/utxo/freeze", "", "", ctJSON, `{"outpoints":[{"txid":"` + strings.Repeat("a", 64) + `","vout":9}]}`},
		{"/v1/utxo/reassign", "", "", ctJSON, `{"txid":"` + strings.Repeat("a", 64) + `","vout":0}`},
		{"/v1/utxo/mined", "", "", ctJSON, `{"txids":["` + strings.Repeat("f", 64) + `"],"block_id":1,"unset":true}`},
		{"/v1/utxo/height", "", "", ctJSON, `{"block_height":-1}`},
		{"/v1/utxo/tx", "", "txid=" + strings.Repeat("a", 64) + "&stale=1", "", ""},
		{"/v1/utxo/tx", "", "txid=nothex", "", ""},
		{"/v1/utxo/blocks/apply", "", "", ctJSON, `{"height":1,"hash":"` + strings.Repeat("1", 64) + `","prev_hash":"` +
			strings.Repeat("0", 64) + `","txs":[{"txid":"` + strings.Repeat("2", 64) + `","coinbase":true,"inputs":[],` +
			`"outputs":[{"vout":0,"utxo_hash":"` + strings.Repeat("3", 64) + `","satoshis":50}]}]}`},
		{"/v1/utxo/blocks/apply", "", "", ctJSON, `{"height":2,"hash":"` + strings.Repeat("4", 64) + `","prev_hash":"` +
			strings.Repeat("1", 64) + `","txs":[{"txid":"` + strings.Repeat("5", 64) + `","inputs":[{"txid":"` +
			strings.Repeat("2", 64) + `","vout":0,"utxo_hash":"` + strings.Repeat("3", 64) + `"}],"outputs":[{"vout":0,"utxo_hash":"` +
			strings.Repeat("6", 64) + `","satoshis":40}]}]}`},
		{"/v1/utxo/blocks/rollback", "", "", ctJSON, `{"to_height":0}`},
		{"/v1/utxo/prune", "", "", "", ""},
		{"/v1/utxo/status", "", "stale=1", "", ""},
	} {
		f.Add(ep(s.path), s.method, s.query, s.headers, []byte(s.body))
	}
	s := startHTTPFuzz(f)
	f.Fuzz(func(t *testing.T, endpoint uint8, method, query, headers string, body []byte) {
		e := fuzzEndpoints[int(endpoint)%len(fuzzEndpoints)]
		if method == "" {
			method = e.method
		}
		if !validMethod(method) {
			return
		}
		target := s.srv.URL() + e.path
		if q := s.subst(query); q != "" {
			target += "?" + requestTarget(q)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader([]byte(s.subst(string(body)))))
		if err != nil {
			return
		}
		for _, line := range strings.Split(headers, "\n") {
			k, v, ok := strings.Cut(line, ":")
			k, v = strings.TrimSpace(k), strings.TrimSpace(s.subst(v))
			if ok && validHeader(k, v) {
				req.Header.Add(k, v)
			}
		}
		done := s.handled(t)
		before := s.capture(t)
		start := time.Now()
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		var raw []byte
		if strings.Contains(e.path, "/subscribe") && resp.StatusCode == http.StatusOK {
			// A subscription streams until the client leaves.
			stop := time.AfterFunc(500*time.Millisecond, cancel)
			raw, _ = io.ReadAll(resp.Body)
			stop.Stop()
		} else if raw, err = io.ReadAll(resp.Body); err != nil {
			t.Fatalf("%s %s: reading the answer: %v", method, target, err)
		}
		resp.Body.Close()
		ours := resp.Header.Get(wire.HeaderServedBy) != ""
		if ours {
			testutil.WaitFor(t, 30*time.Second, "the handler to finish", func() bool { return s.handled(t) >= done+1 })
		}
		end := time.Now()
		status := resp.StatusCode
		if status < 400 {
			return
		}
		var env errcode.Error
		switch {
		case status == http.StatusRequestHeaderFieldsTooLarge && !ours:
			return // net/http's own answer, before any handler
		case method == http.MethodHead:
		case resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(raw, &env) != nil || env.Code == "":
			t.Fatalf("%s %s: %d without an error envelope: %q", method, target, status, raw)
		case api.StatusOf(env.Code) != status:
			t.Fatalf("%s %s: code %s answered %d, the table says %d", method, target, env.Code, status, api.StatusOf(env.Code))
		}
		if status >= 500 {
			if !unavailable[env.Code] {
				t.Fatalf("%s %s: %d %s", method, target, status, raw)
			}
			return
		}
		if decisions[e.path][env.Code] {
			return
		}
		after := s.capture(t)
		if !before.quiet(start, end) || !after.quiet(start, end) {
			return
		}
		was, is := s.entries(t, before.raw), s.entries(t, after.raw)
		for name := range before.forgettable {
			if _, ok := is[name]; !ok {
				delete(was, name) // forgotten meanwhile, by the leader's forgetter
			}
		}
		if diff := changes(was, is); len(diff) > 0 {
			t.Fatalf("%s %s answered %d %s and changed the replicated state:\n%s", method, target, status, raw,
				strings.Join(diff, "\n"))
		}
	})
}
