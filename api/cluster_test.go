package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// commitDoc acquires key, stages doc and commits it; it returns the lease's
// fencing token.
func (e *env) commitDoc(key, doc string) int64 {
	e.t.Helper()
	l := e.acquire(wire.AcquireRequest{Key: key, TTLSeconds: 30}, nil)
	if r := e.update(l, doc); r.status != http.StatusOK {
		e.t.Fatalf("update %s: %d %s", key, r.status, r.body)
	}
	if r := e.release(l, false); r.status != http.StatusOK {
		e.t.Fatalf("release %s: %d %s", key, r.status, r.body)
	}
	return l.FencingToken
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func (e *env) saveSnapshot() []byte {
	e.t.Helper()
	r := e.operator().do(http.MethodGet, "/v1/cluster/snapshot", nil, "")
	if r.status != http.StatusOK {
		e.t.Fatalf("save snapshot: %d %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/octet-stream" {
		e.t.Fatalf("snapshot content type %q", ct)
	}
	if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(r.body)) {
		e.t.Fatalf("Content-Length %q for %d bytes", cl, len(r.body))
	}
	if r.header.Get(wire.HeaderSnapshotIndex) == "" {
		e.t.Fatal("no snapshot index header")
	}
	if got, want := r.header.Get(wire.HeaderSnapshotSHA256), sha256Hex(r.body); got != want {
		e.t.Fatalf("%s %q, but the stream's SHA-256 is %s", wire.HeaderSnapshotSHA256, got, want)
	}
	return r.body
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Save, write more, restore: the later writes are gone, the earlier ones
// are back, and fencing tokens keep growing across the restore.
func TestSnapshotSaveRestoreRoundTrip(t *testing.T) {
	e := newEnv(t)
	e.commitDoc("a", `{"v":"before"}`)
	e.commitDoc("b", `{"b":1}`)
	backup := e.saveSnapshot()

	e.commitDoc("a", `{"v":"after"}`)
	lastA := e.commitDoc("a", `{"v":"after2"}`)
	lastC := e.commitDoc("c", `{"c":1}`)
	held := e.acquire(wire.AcquireRequest{Key: "held", TTLSeconds: 60}, nil)

	// Through the client: upload with Expect: 100-continue.
	c := testutil.OperatorClient(t, e.url, client.WithRetry(0))
	var progressed int64
	res, err := c.RestoreSnapshot(context.Background(), bytes.NewReader(backup), int64(len(backup)),
		func(done, _ int64) { progressed = done })
	if err != nil {
		t.Fatal(err)
	}
	if !res.Restored || res.Bytes != int64(len(backup)) || progressed != int64(len(backup)) {
		t.Fatalf("restore answered %+v after %d bytes, want %d bytes", res, progressed, len(backup))
	}

	if r := e.publicGet("default", "a"); r.status != http.StatusOK || string(r.body) != `{"v":"before"}` {
		t.Fatalf("a after restore: %d %s", r.status, r.body)
	}
	if r := e.publicGet("default", "b"); r.status != http.StatusOK || string(r.body) != `{"b":1}` {
		t.Fatalf("b after restore: %d %s", r.status, r.body)
	}
	if r := e.publicGet("default", "c"); r.status != http.StatusNoContent {
		t.Fatalf("c (written after the backup) after restore: %d %s", r.status, r.body)
	}
	// The lease granted after the backup is gone with the rest of that state.
	if r := e.update(held, `{"x":1}`); r.status != http.StatusForbidden {
		t.Fatalf("update under a lease granted after the backup: %d %s", r.status, r.body)
	}
	for key, last := range map[string]int64{"a": lastA, "c": lastC, "held": held.FencingToken} {
		if l := e.acquire(wire.AcquireRequest{Key: key, TTLSeconds: 30}, nil); l.FencingToken <= last {
			t.Fatalf("%s: token %d after restore, but %d was issued before it", key, l.FencingToken, last)
		}
	}
	// The node keeps working and can be backed up again.
	e.commitDoc("d", `{"d":1}`)
	if again := e.saveSnapshot(); len(again) == 0 {
		t.Fatal("empty snapshot after restore")
	}
}

// An upload sent with X-Expected-SHA256 is restored only when its bytes
// have that checksum: a damaged copy changes nothing, and a malformed
// checksum is a 400.
func TestSnapshotUploadIsCheckedAgainstItsChecksum(t *testing.T) {
	e := newEnv(t)
	e.commitDoc("keep", `{"v":1}`)
	good := e.saveSnapshot()
	e.commitDoc("keep", `{"v":2}`)
	damaged := bytes.Clone(good)
	damaged[len(damaged)/2] ^= 0x40
	wantErr(t, e.operator().do(http.MethodPost, "/v1/cluster/snapshot", map[string]string{wire.HeaderExpectedSHA256: sha256Hex(good)},
		string(damaged)), http.StatusConflict, "expected_sha256_mismatch")
	wantErr(t, e.operator().do(http.MethodPost, "/v1/cluster/snapshot", map[string]string{wire.HeaderExpectedSHA256: "abc"},
		string(good)), http.StatusBadRequest, "invalid_expected_sha256")
	if r := e.publicGet("default", "keep"); r.status != http.StatusOK || string(r.body) != `{"v":2}` {
		t.Fatalf("state after refused uploads: %d %s", r.status, r.body)
	}
	if r := e.operator().do(http.MethodPost, "/v1/cluster/snapshot", map[string]string{wire.HeaderExpectedSHA256: strings.ToUpper(sha256Hex(good))},
		string(good)); r.status != http.StatusOK {
		t.Fatalf("restore with its checksum: %d %s", r.status, r.body)
	}
	if r := e.publicGet("default", "keep"); r.status != http.StatusOK || string(r.body) != `{"v":1}` {
		t.Fatalf("state after the restore: %d %s", r.status, r.body)
	}
}

// A file that is not a raftlockd state file is refused with 400 and a
// stable code, and the state is untouched.
func TestBadSnapshotUploadIs400(t *testing.T) {
	e := newEnv(t)
	e.commitDoc("keep", `{"keep":true}`)
	good := e.saveSnapshot()

	foreign := t.TempDir() + "/other.db"
	db, err := bolt.Open(foreign, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("meta")); return err })
	db.Close()
	foreignBytes := readFile(t, foreign)

	for _, c := range []struct {
		name, body, code string
	}{
		{"garbage", "this is not a snapshot", "invalid_snapshot"},
		{"empty", "", "missing_body"},
		{"truncated", string(good[:len(good)/3]), "invalid_snapshot"},
		{"bbolt file of another application", string(foreignBytes), "invalid_snapshot"},
		// Uploaded without its checksum: the document is matched against
		// its record's etag.
		{"a document damaged in place", strings.Replace(string(good), `{"keep":true}`, `{"keep"xtrue}`, -1), "invalid_snapshot"},
		{"longer than its first page says", string(good) + strings.Repeat("\x00", 4096), "invalid_snapshot"},
	} {
		r := e.operator().do(http.MethodPost, "/v1/cluster/snapshot", nil, c.body)
		if r.status != http.StatusBadRequest {
			t.Fatalf("%s: %d %s, want 400", c.name, r.status, r.body)
		}
		wantErr(t, r, http.StatusBadRequest, c.code)
	}
	// An upload that does not start as a state file is refused after its
	// first bytes, not stored whole.
	zeros := &countingZeros{left: 256 << 20}
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/cluster/snapshot", zeros)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.operator().hc.Do(req); err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		wantErr(t, resp{status: res.StatusCode, header: res.Header, body: body}, http.StatusBadRequest, "invalid_snapshot")
	}
	if sent := zeros.sent.Load(); sent > 64<<20 {
		t.Fatalf("%d bytes of zeros were read before the upload was refused", sent)
	}
	if r := e.publicGet("default", "keep"); r.status != http.StatusOK || string(r.body) != `{"keep":true}` {
		t.Fatalf("state after refused uploads: %d %s", r.status, r.body)
	}
	wantErr(t, e.operator().do(http.MethodPut, "/v1/cluster/snapshot", nil, ""), http.StatusMethodNotAllowed, "method_not_allowed")
}

// countingZeros is left zero bytes, counting what was read.
type countingZeros struct {
	left int64
	sent atomic.Int64
}

func (z *countingZeros) Read(p []byte) (int, error) {
	if z.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.left))
	clear(p[:n])
	z.left -= int64(n)
	z.sent.Add(int64(n))
	return n, nil
}

// The operator endpoints on a one-node cluster, and their input checks.
func TestClusterEndpointsOnOneNode(t *testing.T) {
	e := newEnv(t)
	op := e.operator()
	id := e.srv.Node().ID()
	e.commitDoc("s", `{"s":1}`)

	r := op.do(http.MethodGet, "/v1/cluster/status", nil, "")
	var st wire.ClusterStatusResponse
	r.json(t, &st)
	if r.status != http.StatusOK || st.NodeID != id || st.State != "Leader" || st.LeaderID != id ||
		st.LeaderEndpoint != e.url || st.AppliedIndex == 0 {
		t.Fatalf("status: %d %+v", r.status, st)
	}
	// Every response names the leader next to the serving node.
	if r.header.Get(wire.HeaderLeader) != id || r.header.Get(wire.HeaderServedBy) != id {
		t.Fatalf("headers %v", r.header)
	}
	if h := e.publicGet("default", "none").header; h.Get(wire.HeaderLeader) != id {
		t.Fatalf("no leader header on a read: %v", h)
	}

	var m wire.ClusterMembersResponse
	op.do(http.MethodGet, "/v1/cluster/members", nil, "").json(t, &m)
	if len(m.Members) != 1 || m.Members[0].ID != id || m.Members[0].Suffrage != "voter" || !m.Members[0].Leader ||
		m.Members[0].GossipStatus != "alive" || m.Members[0].Raft == nil || m.Members[0].Raft.State != "Leader" {
		t.Fatalf("members: %+v", m)
	}

	// The only voter cannot leave; the node keeps serving.
	wantErr(t, op.post("/v1/cluster/leave", nil, ""), http.StatusConflict, "last_voter")
	wantErr(t, op.post("/v1/tc/cluster/leave", nil, ""), http.StatusConflict, "last_voter")
	wantErr(t, op.post("/v1/cluster/remove-peer", nil, wire.RemovePeerRequest{ID: id}), http.StatusConflict, "last_voter")
	wantErr(t, op.post("/v1/cluster/remove-peer", nil, wire.RemovePeerRequest{ID: "nobody"}), http.StatusNotFound, "not_found")
	wantErr(t, op.post("/v1/cluster/remove-peer", nil, `{}`), http.StatusBadRequest, "invalid_params")
	wantErr(t, op.post("/v1/cluster/remove-peer", nil, `{"id":"x","extra":1}`), http.StatusBadRequest, "invalid_body")
	wantErr(t, op.do(http.MethodGet, "/v1/cluster/leave", nil, ""), http.StatusMethodNotAllowed, "method_not_allowed")

	// lockd's TC endpoints.
	var lead wire.TCLeaderResponse
	op.do(http.MethodGet, "/v1/tc/leader", nil, "").json(t, &lead)
	if lead.LeaderID != id || lead.LeaderEndpoint != e.url || lead.Term == 0 || lead.ExpiresAt < time.Now().Unix() {
		t.Fatalf("tc leader: %+v", lead)
	}
	var list wire.TCClusterListResponse
	op.do(http.MethodGet, "/v1/tc/cluster/list", nil, "").json(t, &list)
	if len(list.Endpoints) != 1 || list.Endpoints[0] != e.url || list.UpdatedAt == 0 {
		t.Fatalf("tc list: %+v", list)
	}
	var ann wire.TCClusterAnnounceResponse
	r = op.post("/v1/tc/cluster/announce", nil, wire.TCClusterAnnounceRequest{SelfEndpoint: e.url + "/"})
	r.json(t, &ann)
	if r.status != http.StatusOK || len(ann.Endpoints) != 1 || ann.ExpiresAt < time.Now().Add(50*time.Second).Unix() {
		t.Fatalf("announce: %d %s", r.status, r.body)
	}
	wantErr(t, op.post("/v1/tc/cluster/announce", nil, `{}`), http.StatusBadRequest, "invalid_endpoint")
	for _, bad := range []string{"ftp://x", "http://127.0.0.1:99999", "http://127.0.0.1:0", "http://:80"} {
		wantErr(t, op.post("/v1/tc/cluster/announce", nil, wire.TCClusterAnnounceRequest{SelfEndpoint: bad}),
			http.StatusBadRequest, "invalid_endpoint")
	}
	wantErr(t, op.post("/v1/tc/cluster/announce", nil, wire.TCClusterAnnounceRequest{SelfEndpoint: "http://127.0.0.1:1"}),
		http.StatusNotFound, "not_found")
	wantErr(t, op.post("/v1/tc/cluster/leave", nil, wire.TCClusterLeaveRequest{SelfEndpoint: "http://127.0.0.1:1"}),
		http.StatusNotFound, "not_found")

	// Stale reads are an opt-in; a malformed flag is a 400.
	if r := e.do(http.MethodPost, "/v1/get?public=1&stale=1&key=s", nil, ""); r.status != http.StatusOK || string(r.body) != `{"s":1}` {
		t.Fatalf("stale get: %d %s", r.status, r.body)
	}
	var d wire.DescribeResponse
	e.do(http.MethodGet, "/v1/describe?stale=true&key=s", nil, "").json(t, &d)
	if d.Version != 1 {
		t.Fatalf("stale describe: %+v", d)
	}
	wantErr(t, e.do(http.MethodPost, "/v1/get?public=1&stale=perhaps&key=s", nil, ""), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.do(http.MethodGet, "/v1/describe?stale=perhaps&key=s", nil, ""), http.StatusBadRequest, "invalid_params")
}

// A client that reaches only one follower (as a host reaches only the
// published port of a container, not the leader's advertised name)
// restores through it: the follower forwards the upload to the leader,
// which checks and installs it as its own. Progress is reported as the
// upload streams, every node ends with the backup's state and fencing
// tokens keep growing.
func TestClusterRestoreThroughAFollower(t *testing.T) {
	c := testcluster.Start(t, 3)
	l := c.WaitLeader(10 * time.Second)
	f := (l + 1) % 3
	fe := envOf(t, c.Nodes[f].Server)
	le := envOf(t, c.Nodes[l].Server)

	fe.commitDoc("a", `{"a":"backup"}`)
	backup := fe.saveSnapshot()
	lastA := le.commitDoc("a", `{"a":"later"}`)
	lastB := fe.commitDoc("b", `{"b":"later"}`)

	only := strings.TrimPrefix(c.URL(f), "https://")
	var refused atomic.Int64
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: auth.ClientConfig(testutil.OperatorBundle(t, c.CA())),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr != only {
				refused.Add(1)
				return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%s is out of reach", addr)}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}}
	cl, err := client.New(c.URL(f), client.WithHTTPClient(hc), client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	var progressed atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.RestoreSnapshot(ctx, bytes.NewReader(backup), int64(len(backup)),
		func(done, _ int64) { progressed.Store(done) })
	if err != nil {
		t.Fatalf("restore through follower %s: %v", c.Nodes[f].Name, err)
	}
	if !res.Restored || res.Bytes != int64(len(backup)) || progressed.Load() != int64(len(backup)) {
		t.Fatalf("restore answered %+v after %d bytes, want %d bytes", res, progressed.Load(), len(backup))
	}
	if n := refused.Load(); n != 0 {
		t.Fatalf("the client tried %d times to reach another node than the follower", n)
	}
	c.WaitConverged(10 * time.Second)
	for _, i := range c.Running() {
		e := envOf(t, c.Nodes[i].Server)
		if r := e.publicGet("default", "a"); r.status != http.StatusOK || string(r.body) != `{"a":"backup"}` {
			t.Fatalf("a on %s after restore: %d %s", c.Nodes[i].Name, r.status, r.body)
		}
		if r := e.publicGet("default", "b"); r.status != http.StatusNoContent {
			t.Fatalf("b (written after the backup) on %s after restore: %d %s", c.Nodes[i].Name, r.status, r.body)
		}
	}
	for key, last := range map[string]int64{"a": lastA, "b": lastB} {
		if next := fe.commitDoc(key, `{"after":"restore"}`); next <= last {
			t.Fatalf("%s: token %d after restore, but %d was issued before it", key, next, last)
		}
	}

	// The leader's checks apply to a forwarded upload, and its answer
	// reaches the client unchanged.
	wantErr(t, fe.operator().do(http.MethodPost, "/v1/cluster/snapshot", nil, "this is not a snapshot"),
		http.StatusBadRequest, "invalid_snapshot")
	wantErr(t, fe.operator().do(http.MethodPost, "/v1/cluster/snapshot", nil, ""), http.StatusBadRequest, "missing_body")
	// The follower passes the checksum on: the leader refuses an upload
	// that does not match it.
	wantErr(t, fe.operator().do(http.MethodPost, "/v1/cluster/snapshot", map[string]string{wire.HeaderExpectedSHA256: sha256Hex([]byte("other"))},
		string(backup)), http.StatusConflict, "expected_sha256_mismatch")
	// A forwarded upload is never forwarded again: a follower refuses it.
	wantErr(t, fe.operator().do(http.MethodPost, "/v1/cluster/snapshot", map[string]string{"X-Raftlockd-Forwarded-By": "other"},
		string(backup)), http.StatusServiceUnavailable, "not_leader")
	if r := fe.publicGet("default", "a"); r.status != http.StatusOK || string(r.body) != `{"after":"restore"}` {
		t.Fatalf("a after refused uploads: %d %s", r.status, r.body)
	}
}

// Requests waiting when a backup is restored wait on in the restored
// state: an acquirer whose key the backup holds free gets it at once, and a
// consumer blocked on a queue receives the next message enqueued, both long
// before their waits run out.
func TestWaitersKeepWaitingAcrossARestore(t *testing.T) {
	e := newEnv(t)
	e.commitDoc("w", `{"v":1}`)
	backup := e.saveSnapshot()

	e.acquire(wire.AcquireRequest{Key: "w", Owner: "holder", TTLSeconds: 60}, nil)
	acquired := e.postAsync(context.Background(), nil, wire.AcquireRequest{Key: "w", Owner: "waiter", TTLSeconds: 30, BlockSecs: 60})
	testutil.WaitFor(t, 5*time.Second, "the acquirer to queue", func() bool { return e.describe("w").Waiters == 1 })
	dequeued := make(chan resp, 1)
	go func() { dequeued <- e.dequeueRaw(`{"queue":"jobs","owner":"c","wait_seconds":60}`) }()
	testutil.WaitFor(t, 5*time.Second, "the consumer to wait", func() bool { return e.stats("jobs").WaitingConsumers == 1 })

	c := testutil.OperatorClient(t, e.url, client.WithRetry(0))
	if _, err := c.RestoreSnapshot(testCtx(t), bytes.NewReader(backup), int64(len(backup)), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-acquired:
		var l wire.AcquireResponse
		if got.err != nil || got.r.status != http.StatusOK {
			t.Fatalf("the waiting acquire after the restore: %v %d %s", got.err, got.r.status, got.r.body)
		}
		got.r.json(t, &l)
		if l.Owner != "waiter" || l.LeaseID == "" {
			t.Fatalf("the waiting acquire got %+v", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the acquirer still waits for a key the restored state holds free")
	}
	testutil.WaitFor(t, 10*time.Second, "the consumer to wait in the restored state", func() bool {
		return e.stats("jobs").WaitingConsumers == 1
	})
	sent := e.enqueue("jobs", "after the restore")
	select {
	case r := <-dequeued:
		ds := parseDeliveries(t, r)
		if len(ds) != 1 || ds[0].meta.Message == nil || ds[0].meta.Message.MessageID != sent.MessageID {
			t.Fatalf("the waiting consumer got %+v, want message %s", ds, sent.MessageID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer waiting across the restore never received the message enqueued after it")
	}
}
