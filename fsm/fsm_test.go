package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

// recorder keeps every published event.
type recorder struct{ events []Event }

func (r *recorder) Observe(ev []Event) { r.events = append(r.events, ev...) }

type harness struct {
	t     *testing.T
	f     *FSM
	rec   *recorder
	index uint64
	now   int64
}

func openHarness(t *testing.T, dir string) *harness {
	t.Helper()
	rec := &recorder{}
	f, err := Open(filepath.Join(dir, "state.db"), Options{Observers: []Observer{rec}, BootID: "boot-a",
		Fatal: func(err error) { t.Fatalf("unexpected fatal: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &harness{t: t, f: f, rec: rec, index: f.Applied(), now: 1_000_000}
}

func logOf(t *testing.T, index uint64, c *Command) *raft.Log {
	t.Helper()
	data, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// run applies commands as one batch, stamping the harness clock.
func (h *harness) run(cmds ...*Command) []*Result {
	h.t.Helper()
	logs := make([]*raft.Log, len(cmds))
	for i, c := range cmds {
		if c.Now == 0 {
			c.Now = h.now
		}
		h.index++
		logs[i] = logOf(h.t, h.index, c)
	}
	out := h.f.ApplyBatch(logs)
	res := make([]*Result, len(out))
	for i, r := range out {
		res[i] = r.(*Result)
	}
	return res
}

func (h *harness) one(c *Command) *Result { return h.run(c)[0] }

func (h *harness) hash() []byte {
	var sum []byte
	if err := h.f.View(func(v *View) error { sum = v.Hash(); return nil }); err != nil {
		h.t.Fatal(err)
	}
	return sum
}

func acq(key, txn, req string, ttl, wait int64) *Command {
	return &Command{Op: OpAcquire, Acquire: &AcquireCmd{Namespace: "default", Key: key, Owner: "o-" + req,
		TxnID: txn, LeaseID: "lease-" + req, RequestID: req, TTL: ttl, Wait: wait}}
}

func update(l *LeaseInfo, doc string) *Command {
	return &Command{Op: OpWrite, Write: &WriteCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID,
		TxnID: l.TxnID, ETag: "etag-" + doc, Doc: []byte(doc)}}
}

func release(l *LeaseInfo, rollback bool) *Command {
	return &Command{Op: OpRelease, Release: &ReleaseCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID,
		TxnID: l.TxnID, Rollback: rollback}}
}

func sweep() *Command {
	return &Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 100, TxnRetention: 60_000}}
}

func mustLease(t *testing.T, r *Result) *LeaseInfo {
	t.Helper()
	if r.Err != nil || r.Lease == nil {
		t.Fatalf("expected a lease, got %+v (err %v)", r, r.Err)
	}
	return r.Lease
}

func wantCode(t *testing.T, r *Result, code *errcode.Error) {
	t.Helper()
	if !errors.Is(r.Error(), code) {
		t.Fatalf("expected %s, got %+v (err %v)", code.Code, r, r.Err)
	}
}

func (h *harness) publicDoc(key string) Doc {
	var d Doc
	_ = h.f.View(func(v *View) error { d = v.PublicDoc("default", key); return nil })
	return d
}

func TestHandOffIsFIFOAndInTheReleasingStep(t *testing.T) {
	h := openHarness(t, t.TempDir())
	first := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	if first.Token != 1 {
		t.Fatalf("first token = %d, want 1", first.Token)
	}
	for i := 2; i <= 4; i++ {
		if r := h.one(acq("k", "t"+strconv.Itoa(i), "r"+strconv.Itoa(i), 10_000, 5_000)); !r.Queued {
			t.Fatalf("acquire %d not queued: %+v", i, r)
		}
	}
	cur := first
	for want := 2; want <= 4; want++ {
		h.rec.events = nil
		if r := h.one(release(cur, false)); !r.Released || r.Decision != TxnCommit {
			t.Fatalf("release: %+v", r)
		}
		var granted *Event
		for i := range h.rec.events {
			if h.rec.events[i].Kind == EventGranted {
				granted = &h.rec.events[i]
			}
		}
		if granted == nil || granted.RequestID != "r"+strconv.Itoa(want) {
			t.Fatalf("release did not hand the key to r%d: %+v", want, h.rec.events)
		}
		if granted.Lease.Token != int64(want) {
			t.Fatalf("token = %d, want %d", granted.Lease.Token, want)
		}
		cur = granted.Lease
	}
}

func TestCommitPublishesAndRollbackDiscards(t *testing.T) {
	h := openHarness(t, t.TempDir())
	a := mustLease(t, h.one(acq("a", "tx", "r1", 10_000, 0)))
	b := mustLease(t, h.one(acq("b", "tx", "r2", 10_000, 0)))
	for _, c := range []*Command{update(a, `{"v":1}`), update(b, `{"v":2}`)} {
		if r := h.one(c); r.Err != nil || r.Write.Version != 1 {
			t.Fatalf("update: %+v", r)
		}
	}
	if d := h.publicDoc("a"); d.Exists {
		t.Fatalf("staged write visible to public reads: %+v", d)
	}
	var held Doc
	_ = h.f.View(func(v *View) error {
		var err error
		held, err = v.LeaseDoc("default", "a", a.LeaseID, a.TxnID, a.Token, h.now)
		return err
	})
	if string(held.Bytes) != `{"v":1}` {
		t.Fatalf("holder does not read its own staged write: %+v", held)
	}
	if r := h.one(release(a, false)); !r.Released {
		t.Fatalf("release: %+v", r)
	}
	for key, want := range map[string]string{"a": `{"v":1}`, "b": `{"v":2}`} {
		if d := h.publicDoc(key); string(d.Bytes) != want || d.Version != 1 {
			t.Fatalf("%s after commit: %+v", key, d)
		}
	}
	// Releasing the second key of the committed transaction is idempotent.
	if r := h.one(release(b, false)); !r.Released {
		t.Fatalf("second release of committed txn: %+v", r)
	}
	wantCode(t, h.one(release(b, true)), errcode.TxnCommitted)
	wantCode(t, h.one(acq("c", "tx", "r3", 10_000, 0)), errcode.TxnCommitted)

	c := mustLease(t, h.one(acq("a", "tx2", "r4", 10_000, 0)))
	h.one(update(c, `{"v":9}`))
	if r := h.one(release(c, true)); !r.Released || r.Decision != TxnRollback {
		t.Fatalf("rollback: %+v", r)
	}
	if d := h.publicDoc("a"); string(d.Bytes) != `{"v":1}` {
		t.Fatalf("rollback leaked a staged write: %+v", d)
	}
}

func TestExpiryRollsBackTheWholeTransactionAndHandsOff(t *testing.T) {
	h := openHarness(t, t.TempDir())
	a := mustLease(t, h.one(acq("a", "tx", "r1", 1_000, 0)))
	b := mustLease(t, h.one(acq("b", "tx", "r2", 5_000, 0)))
	h.one(update(a, `{"a":1}`))
	h.one(update(b, `{"b":1}`))
	if r := h.one(acq("b", "other", "r3", 1_000, 10_000)); !r.Queued {
		t.Fatalf("not queued: %+v", r)
	}
	h.now += 1_000 // a expires; b does not
	h.rec.events = nil
	r := h.one(sweep())
	if r.Sweep == nil || r.Sweep.Expired != 1 {
		t.Fatalf("sweep: %+v", r)
	}
	if len(h.rec.events) == 0 {
		t.Fatal("no events")
	}
	var granted bool
	for _, e := range h.rec.events {
		granted = granted || (e.Kind == EventGranted && e.RequestID == "r3" && e.Lease.Token == 2)
	}
	if !granted {
		t.Fatalf("b was not handed to the waiter when its transaction rolled back: %+v", h.rec.events)
	}
	for _, key := range []string{"a", "b"} {
		if d := h.publicDoc(key); d.Exists {
			t.Fatalf("%s has state after rollback: %+v", key, d)
		}
	}
	wantCode(t, h.one(update(a, `{"late":1}`)), errcode.LeaseExpired)
	wantCode(t, h.one(release(a, false)), errcode.LeaseExpired)
	if r := h.one(release(a, true)); !r.Released {
		t.Fatalf("rollback release after expiry: %+v", r)
	}
}

func TestRetriedAcquireGetsTheSameLease(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l1 := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	retry := acq("k", "t-other", "r1", 10_000, 5_000)
	l2 := mustLease(t, h.one(retry))
	if *l1 != *l2 {
		t.Fatalf("retry got %+v, want %+v", l2, l1)
	}
	if r := h.one(acq("k", "t2", "r2", 10_000, 5_000)); !r.Queued {
		t.Fatalf("%+v", r)
	}
	before := h.hashWithoutMeta()
	if r := h.one(acq("k", "t2", "r2", 10_000, 5_000)); !r.Queued {
		t.Fatalf("%+v", r)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a retried queued acquire queued twice")
	}
	// Cancelling after the grant returns the lease.
	h.one(release(l1, false))
	r := h.one(&Command{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: "default", Key: "k", RequestID: "r2"}})
	if r.Lease == nil || r.Lease.LeaseID != "lease-r2" {
		t.Fatalf("cancel after grant: %+v", r)
	}
}

func TestCASAndFencing(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	v0 := int64(0)
	c := update(l, `{"x":1}`)
	c.Write.IfVersion = &v0
	if r := h.one(c); r.Err != nil {
		t.Fatal(r.Err)
	}
	c = update(l, `{"x":2}`)
	c.Write.IfVersion = &v0
	r := h.one(c)
	wantCode(t, r, errcode.VersionConflict)
	if r.Err.CurrentVersion != 1 || r.Err.CurrentETag != `etag-{"x":1}` {
		t.Fatalf("conflict lacks current state: %+v", r.Err)
	}
	c = update(l, `{"x":3}`)
	c.Write.IfETag = "nope"
	wantCode(t, h.one(c), errcode.ETagMismatch)
	c = update(l, `{"x":4}`)
	c.Write.Token = 7
	wantCode(t, h.one(c), errcode.FencingMismatch)
	c = update(l, `{"x":5}`)
	c.Write.LeaseID = "someone-else"
	wantCode(t, h.one(c), errcode.LeaseRequired)
	c = update(l, `{"x":6}`)
	c.Write.TxnID = "other"
	wantCode(t, h.one(c), errcode.TxnMismatch)
	wantCode(t, h.one(acq("k", "t9", "r9", 10_000, 0)), errcode.Waiting)
	ine := acq("k", "t8", "r8", 10_000, 0)
	ine.Acquire.IfNotExists = true
	wantCode(t, h.one(ine), errcode.AlreadyExists)
}

// TestRejectedCommandsChangeNothing drives random commands and checks that
// every rejected one leaves the buckets exactly as they were, and that the
// cross-bucket invariants hold after every step.
func TestRejectedCommandsChangeNothing(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	g := newGen(seed)
	h := openHarness(t, t.TempDir())
	accepted := 0
	for i := 0; i < 3000; i++ {
		h.now += g.rng.Int64N(400)
		c := g.next()
		before := h.hashWithoutMeta()
		r := h.one(c)
		g.learn(r)
		if r.Err != nil && !bytes.Equal(before, h.hashWithoutMeta()) {
			t.Fatalf("seed %d step %d: rejected %s (%v) changed the state", seed, i, c.Op, r.Err)
		}
		if r.Err == nil {
			accepted++
		}
		if err := invariants(h); err != nil {
			t.Fatalf("seed %d step %d: after %s: %v", seed, i, c.Op, err)
		}
	}
	if accepted < 1000 {
		t.Fatalf("seed %d: only %d of 3000 commands were accepted; the generator is too weak", seed, accepted)
	}
}

// TestSameLogSameState applies one random log to two state machines in
// different batch sizes and compares every bucket.
func TestSameLogSameState(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	g := newGen(seed)
	a := openHarness(t, t.TempDir())
	var logs []*raft.Log
	now := int64(1_000_000)
	for i := 0; i < 2000; i++ {
		now += g.rng.Int64N(400)
		c := g.next()
		c.Now = now
		l := logOf(t, uint64(i+1), c)
		logs = append(logs, l)
		g.learn(a.f.ApplyBatch([]*raft.Log{l})[0].(*Result))
	}
	b := openHarness(t, t.TempDir())
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	for i := 0; i < len(logs); {
		n := 1 + rng.IntN(64)
		if i+n > len(logs) {
			n = len(logs) - i
		}
		b.f.ApplyBatch(logs[i : i+n])
		i += n
	}
	if !bytes.Equal(a.hash(), b.hash()) {
		t.Fatalf("seed %d: state differs between one-by-one and batched apply", seed)
	}
}

func TestRestartSkipsAppliedEntries(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	var logs []*raft.Log
	for i, c := range []*Command{acq("k", "t1", "r1", 10_000, 0), acq("k", "t2", "r2", 10_000, 5_000)} {
		c.Now = h.now
		logs = append(logs, logOf(t, uint64(i+1), c))
	}
	h.f.ApplyBatch(logs)
	want := h.hash()
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	h2 := openHarness(t, dir)
	if !h2.f.Trusted() || h2.f.Applied() != 2 {
		t.Fatalf("trusted=%v applied=%d", h2.f.Trusted(), h2.f.Applied())
	}
	h2.f.ApplyBatch(logs) // raft replays entries after its last snapshot
	if !bytes.Equal(want, h2.hash()) {
		t.Fatal("replayed entries were applied twice")
	}
}

func TestUntrustedStateIsDiscardedAfterAnOSRestart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	f, err := Open(path, Options{BootID: "boot-a"})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := Encode(acq("k", "t1", "r1", 10_000, 0))
	f.ApplyBatch([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: data}})
	_ = f.db.Close() // a crash: no clean marker

	same, err := Open(path, Options{BootID: "boot-a"})
	if err != nil {
		t.Fatal(err)
	}
	if !same.Trusted() || same.Applied() != 1 {
		t.Fatalf("same boot: trusted=%v applied=%d", same.Trusted(), same.Applied())
	}
	_ = same.db.Close()

	other, err := Open(path, Options{BootID: "boot-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.Trusted() || other.Applied() != 0 {
		t.Fatalf("after reboot: trusted=%v applied=%d", other.Trusted(), other.Applied())
	}
}

type memSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { return nil }

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	src := openHarness(t, t.TempDir())
	l := mustLease(t, src.one(acq("k", "t1", "r1", 10_000, 0)))
	src.one(update(l, `{"a":1}`))
	src.one(release(l, false))
	mustLease(t, src.one(acq("k2", "t2", "r2", 10_000, 0)))
	snap, err := src.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Applies continue while the snapshot is persisted.
	src.one(acq("k3", "t3", "r3", 10_000, 0))
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()

	dst := openHarness(t, t.TempDir())
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if dst.f.Applied() != 4 {
		t.Fatalf("applied after restore = %d, want 4", dst.f.Applied())
	}
	if d := dst.publicDoc("k"); string(d.Bytes) != `{"a":1}` {
		t.Fatalf("restored doc: %+v", d)
	}
	// Replaying the entry after the snapshot converges on the source's state.
	c := acq("k3", "t3", "r3", 10_000, 0)
	c.Now = src.now
	dst.f.ApplyBatch([]*raft.Log{logOf(t, 5, c)})
	if !bytes.Equal(src.hash(), dst.hash()) {
		t.Fatal("restored state differs from the source")
	}
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader([]byte("not a bolt file")))); err == nil {
		t.Fatal("restore accepted garbage")
	}
}

func TestStorageFailureStopsTheNode(t *testing.T) {
	var fatal error
	f, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{Fatal: func(err error) { fatal = err }})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.db.Close()
	data, _ := Encode(acq("k", "t1", "r1", 10_000, 0))
	out := f.ApplyBatch([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: data}})
	if fatal == nil {
		t.Fatal("storage failure did not stop the node")
	}
	if r := out[0].(*Result); r.Err == nil {
		t.Fatal("failed batch reported success")
	}
}

func TestMalformedEntriesAreRejectedDeterministically(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for _, data := range [][]byte{nil, {9}, {formatV1}, []byte("\x01{}\n"), []byte("\x01{\"op\":\"acquire\"}\n"),
		[]byte("\x01{\"op\":\"nope\",\"sweep\":{\"limit\":1}}\n"), []byte("\x01{\"op\":\"sweep\",\"sweep\":{\"limit\":1}}\nxx")} {
		h.index++
		before := h.hashWithoutMeta()
		r := h.f.ApplyBatch([]*raft.Log{{Index: h.index, Term: 1, Type: raft.LogCommand, Data: data}})[0].(*Result)
		if r.Err == nil {
			t.Fatalf("%q accepted", data)
		}
		if !bytes.Equal(before, h.hashWithoutMeta()) {
			t.Fatalf("%q changed the state", data)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, c := range []*Command{acq("k", "t", "r", 1, 0), update(&LeaseInfo{Namespace: "n", Key: "k", LeaseID: "l"}, `{}`), sweep()} {
		data, _ := Encode(c)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			return
		}
		again, err := Encode(c)
		if err != nil {
			t.Fatalf("decoded command does not encode: %v", err)
		}
		if _, err := Decode(again); err != nil {
			t.Fatalf("re-encoded command does not decode: %v", err)
		}
	})
}

func (h *harness) hashWithoutMeta() []byte {
	var out []byte
	_ = h.f.View(func(v *View) error {
		var buf bytes.Buffer
		c := v.tx.Cursor()
		for name, _ := c.First(); name != nil; name, _ = c.Next() {
			if bytes.Equal(name, bucketMeta) {
				continue
			}
			bc := v.tx.Bucket(name).Cursor()
			for k, val := bc.First(); k != nil; k, val = bc.Next() {
				fmt.Fprintf(&buf, "%q=%q;", k, val)
			}
		}
		out = buf.Bytes()
		return nil
	})
	return out
}

func events(h *harness, kind EventKind) map[string]*Event {
	out := map[string]*Event{}
	for i := range h.rec.events {
		if e := &h.rec.events[i]; e.Kind == kind {
			out[e.RequestID] = e
		}
	}
	return out
}

// A transaction with two requests queued on one key gets the key once; when
// it is decided it can never be granted the key again.
func TestDecidedTransactionIsNeverGrantedAgain(t *testing.T) {
	h := openHarness(t, t.TempDir())
	u := mustLease(t, h.one(acq("k", "tu", "ru", 10_000, 0)))
	for _, req := range []string{"a1", "a2"} {
		if r := h.one(acq("k", "ta", req, 10_000, 5_000)); !r.Queued {
			t.Fatalf("%s not queued: %+v", req, r)
		}
	}
	if r := h.one(acq("k", "tb", "b1", 10_000, 5_000)); !r.Queued {
		t.Fatalf("b1 not queued: %+v", r)
	}
	h.rec.events = nil
	h.one(release(u, false))
	granted := events(h, EventGranted)
	if granted["a1"] == nil || granted["a2"] == nil || *granted["a1"].Lease != *granted["a2"].Lease {
		t.Fatalf("both requests of ta should share the grant: %+v", h.rec.events)
	}
	h.rec.events = nil
	h.one(release(granted["a1"].Lease, false))
	granted = events(h, EventGranted)
	if len(granted) != 1 || granted["b1"] == nil || granted["b1"].Lease.Token != 3 {
		t.Fatalf("after ta committed the key must go to tb: %+v", h.rec.events)
	}
	checkInvariants(t, h)
}

// Deciding a transaction ends its queued acquires on every key.
func TestDecisionEndsTheTransactionsQueuedAcquires(t *testing.T) {
	h := openHarness(t, t.TempDir())
	mustLease(t, h.one(acq("busy", "tx", "hold", 10_000, 0)))
	mine := mustLease(t, h.one(acq("mine", "t1", "m", 10_000, 0)))
	if r := h.one(acq("busy", "t1", "w", 10_000, 5_000)); !r.Queued {
		t.Fatalf("%+v", r)
	}
	h.rec.events = nil
	h.one(release(mine, true))
	ended := events(h, EventWaitEnded)
	if ended["w"] == nil || !errors.Is(ended["w"].Err, errcode.TxnRolledBack) {
		t.Fatalf("queued acquire of the decided transaction not ended: %+v", h.rec.events)
	}
	checkInvariants(t, h)
}

// A transaction with any expired lease cannot commit, even before the
// sweeper ran.
func TestCommitRefusedWhenAnyLeaseOfTheTransactionExpired(t *testing.T) {
	h := openHarness(t, t.TempDir())
	a := mustLease(t, h.one(acq("a", "tx", "r1", 1_000, 0)))
	b := mustLease(t, h.one(acq("b", "tx", "r2", 10_000, 0)))
	h.one(update(a, `{"a":1}`))
	h.one(update(b, `{"b":1}`))
	h.now += 1_500
	wantCode(t, h.one(release(b, false)), errcode.LeaseExpired)
	if d := h.publicDoc("a"); d.Exists {
		t.Fatalf("a committed with an expired lease: %+v", d)
	}
	if r := h.one(release(b, true)); r.Decision != TxnRollback {
		t.Fatalf("%+v", r)
	}
	var rec *TxnRecord
	_ = h.f.View(func(v *View) error { rec = v.Txn("tx"); return nil })
	if rec.Reason != ReasonExpired {
		t.Fatalf("rollback of an expired transaction recorded as %q", rec.Reason)
	}
}

func TestTransactionsAreBounded(t *testing.T) {
	h := openHarness(t, t.TempDir())
	cmds := make([]*Command, MaxParticipants)
	for i := range cmds {
		cmds[i] = acq("k"+strconv.Itoa(i), "big", "r"+strconv.Itoa(i), 10_000, 0)
	}
	for _, r := range h.run(cmds...) {
		mustLease(t, r)
	}
	wantCode(t, h.one(acq("one-more", "big", "x", 10_000, 0)), errcode.TxnTooLarge)
	// An expiry of such a transaction is spread over several sweeps.
	h.now += 20_000
	r := h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 10, TxnRetention: 60_000}})
	if !r.Sweep.More {
		t.Fatalf("sweep claims to be done: %+v", r.Sweep)
	}
}

// checkInvariants verifies the cross-bucket invariants: every key's waiter
// count matches its queue, every index entry points at what it indexes, and
// every lease belongs to a pending transaction.
func checkInvariants(t *testing.T, h *harness) {
	t.Helper()
	if err := invariants(h); err != nil {
		t.Fatal(err)
	}
}

func invariants(h *harness) error {
	return h.f.View(func(v *View) error {
		queued := map[string]int64{}
		c := v.tx.Bucket(bucketWaiters).Cursor()
		for wk, raw := c.First(); wk != nil; wk, raw = c.Next() {
			queued[string(waiterOwner(wk))]++
			var w Waiter
			if err := json.Unmarshal(raw, &w); err != nil {
				return err
			}
			if !bytes.Equal(v.tx.Bucket(bucketWaitReq).Get([]byte(w.RequestID)), wk) {
				return fmt.Errorf("waiter %q lacks its request index", wk)
			}
			if v.tx.Bucket(bucketWaitTxn).Get(txnWaiterKey(w.TxnID, wk)) == nil {
				return fmt.Errorf("waiter %q lacks its txn index", wk)
			}
			if v.tx.Bucket(bucketWaitExp).Get(timerKey(w.Deadline, wk)) == nil {
				return fmt.Errorf("waiter %q lacks its deadline index", wk)
			}
			if tr := v.Txn(w.TxnID); tr != nil && tr.State != TxnPending {
				return fmt.Errorf("waiter %q belongs to decided txn %s", wk, w.TxnID)
			}
		}
		leases := 0
		kc := v.tx.Bucket(bucketKeys).Cursor()
		for k, raw := kc.First(); k != nil; k, raw = kc.Next() {
			var rec KeyRecord
			if err := json.Unmarshal(raw, &rec); err != nil {
				return err
			}
			if rec.Waiters != queued[string(k)] {
				return fmt.Errorf("%q counts %d waiters, queue has %d", k, rec.Waiters, queued[string(k)])
			}
			if rec.Waiters > 0 && rec.Lease == nil {
				return fmt.Errorf("%q has waiters but no holder", k)
			}
			if rec.Lease != nil {
				leases++
				if v.tx.Bucket(bucketLeaseExp).Get(timerKey(rec.Lease.ExpiresAt, k)) == nil {
					return fmt.Errorf("lease on %q lacks its expiry index", k)
				}
				if tr := v.Txn(rec.Lease.TxnID); tr == nil || tr.State != TxnPending {
					return fmt.Errorf("lease on %q belongs to a decided or unknown txn", k)
				}
			}
		}
		for _, b := range [][]byte{bucketWaitReq, bucketWaitExp, bucketWaitTxn} {
			if n := v.tx.Bucket(b).Stats().KeyN; n != v.tx.Bucket(bucketWaiters).Stats().KeyN {
				return fmt.Errorf("%s has %d entries for %d waiters", b, n, v.tx.Bucket(bucketWaiters).Stats().KeyN)
			}
		}
		if n := v.tx.Bucket(bucketLeaseExp).Stats().KeyN; n != leases {
			return fmt.Errorf("lease_exp has %d entries for %d leases", n, leases)
		}
		return nil
	})
}
