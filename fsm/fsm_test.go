package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

// recorder keeps every published event.
type recorder struct{ events []Event }

func (r *recorder) Observe(ev []Event) { r.events = append(r.events, ev...) }

type harness struct {
	t     testing.TB
	f     *FSM
	rec   *recorder
	index uint64
	now   int64
}

func openHarness(t testing.TB, dir string) *harness {
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

func logOf(t testing.TB, index uint64, c *Command) *raft.Log {
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
		TxnID: l.TxnID, ETag: etagOf(doc), Doc: []byte(doc)}}
}

// etagOf is a document's ETag as the servers compute it.
func etagOf(doc string) string {
	sum := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(sum[:])
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

// The queue order survives wait sequence numbers past one byte: the 257th
// queued acquire still comes after the 256th.
func TestHandOffStaysFIFOPastTheFirst256Waits(t *testing.T) {
	h := openHarness(t, t.TempDir())
	cur := mustLease(t, h.one(acq("k", "t0", "r0", 10_000, 0)))
	const n = 300
	cmds := make([]*Command, n)
	for i := range cmds {
		cmds[i] = acq("k", "t"+strconv.Itoa(i+1), "r"+strconv.Itoa(i+1), 10_000, 5_000)
	}
	for i, r := range h.run(cmds...) {
		if !r.Queued {
			t.Fatalf("acquire %d not queued: %+v", i+1, r)
		}
	}
	for want := 1; want <= n; want++ {
		h.rec.events = nil
		h.one(release(cur, false))
		e := events(h, EventGranted)["r"+strconv.Itoa(want)]
		if e == nil {
			t.Fatalf("release did not hand the key to r%d: %+v", want, h.rec.events)
		}
		cur = e.Lease
	}
}

// A queued acquire whose wait ends in the step that frees the key is told
// so and not granted: its requester stops waiting at the deadline.
func TestHandOffSkipsAWaitEndingAtThatMoment(t *testing.T) {
	h := openHarness(t, t.TempDir())
	held := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	h.one(acq("k", "t2", "r2", 10_000, 5_000))
	h.now += 5_000
	h.rec.events = nil
	h.one(release(held, false))
	if e := events(h, EventGranted)["r2"]; e != nil {
		t.Fatalf("granted at the end of its wait: %+v", e)
	}
	if e := events(h, EventWaitEnded)["r2"]; e == nil || e.Err.Code != errcode.Waiting.Code {
		t.Fatalf("wait end: %+v", e)
	}
	if l := mustLease(t, h.one(acq("k", "t3", "r3", 10_000, 0))); l.Token != 2 {
		t.Fatalf("the key was not free after the release: %+v", l)
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
	wantCode(t, h.one(release(a, false)), errcode.TxnRolledBack)
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

// attempt makes c (an acquire or a cancel) one attempt of its request.
func attempt(c *Command, id string) *Command {
	if c.Acquire != nil {
		c.Acquire.Attempt = id
	}
	if c.CancelWait != nil {
		c.CancelWait.Attempt = id
	}
	return c
}

func cancelWait(req, attemptID string) *Command {
	return &Command{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: "default", Key: "k", RequestID: req, Attempt: attemptID}}
}

// A retry of a queued acquire takes the queued place over: the attempt it
// replaced can no longer withdraw it, and the end of the wait is reported
// to the attempt that waits.
func TestRetryTakesOverTheQueuedPlace(t *testing.T) {
	h := openHarness(t, t.TempDir())
	holder := mustLease(t, h.one(acq("k", "t1", "r1", 60_000, 0)))
	if r := h.one(acq("k", "t0", "r0", 10_000, 60_000)); !r.Queued {
		t.Fatalf("%+v", r)
	}
	if r := h.one(attempt(acq("k", "t2", "req", 10_000, 5_000), "A")); !r.Queued {
		t.Fatalf("first attempt not queued: %+v", r)
	}
	// A retry that does not wait answers at once and leaves the queue alone.
	r := h.one(attempt(acq("k", "t3", "req", 10_000, 0), "C"))
	wantCode(t, r, errcode.Waiting)
	if r.Err.RetryAfter != 60 {
		t.Fatalf("retry_after %d, want the holder's remaining 60s", r.Err.RetryAfter)
	}
	h.now += 1_000
	if r := h.one(attempt(acq("k", "t4", "req", 10_000, 30_000), "B")); !r.Queued {
		t.Fatalf("retry not queued: %+v", r)
	}
	checkInvariants(t, h)
	// The abandoned first attempt cancels: nothing changes.
	before := h.hashWithoutMeta()
	h.rec.events = nil
	if r := h.one(cancelWait("req", "A")); r.Cancelled || r.Lease != nil || r.RetryAfter != 59 {
		t.Fatalf("cancel of a replaced attempt: %+v", r)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) || len(events(h, EventWaitEnded)) != 0 {
		t.Fatalf("a replaced attempt withdrew the queued request: %+v", h.rec.events)
	}
	// The retry's own budget counts: past the first attempt's deadline the
	// request still waits.
	h.now += 10_000
	h.one(sweep())
	if ended := events(h, EventWaitEnded); ended["req"] != nil {
		t.Fatalf("the retry was timed out on the first attempt's deadline: %+v", ended["req"])
	}
	// It keeps its place: after r0, before anyone who queued later.
	if r := h.one(acq("k", "t5", "r5", 10_000, 30_000)); !r.Queued {
		t.Fatalf("%+v", r)
	}
	h.rec.events = nil
	h.one(release(holder, false))
	g := events(h, EventGranted)
	if g["r0"] == nil {
		t.Fatalf("r0 not granted: %+v", h.rec.events)
	}
	h.rec.events = nil
	h.one(release(g["r0"].Lease, false))
	g = events(h, EventGranted)
	if g["req"] == nil || g["req"].Lease.LeaseID != "lease-req" {
		t.Fatalf("the retried request lost its place: %+v", h.rec.events)
	}
	// Cancelling the attempt that waits after the grant returns the lease.
	if r := h.one(cancelWait("req", "B")); r.Lease == nil || r.Lease.LeaseID != "lease-req" {
		t.Fatalf("%+v", r)
	}
	checkInvariants(t, h)
}

// The attempt that waits withdraws the request; its end is reported with
// that attempt and when the holder's lease runs out.
func TestCancelByTheWaitingAttempt(t *testing.T) {
	h := openHarness(t, t.TempDir())
	mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	h.one(attempt(acq("k", "t2", "req", 10_000, 5_000), "A"))
	h.one(attempt(acq("k", "t2", "req", 10_000, 5_000), "B"))
	h.now += 2_500
	h.rec.events = nil
	r := h.one(cancelWait("req", "B"))
	if !r.Cancelled || r.RetryAfter != 8 {
		t.Fatalf("cancel: %+v", r)
	}
	e := events(h, EventWaitEnded)["req"]
	if e == nil || e.Attempt != "B" || !errors.Is(e.Err, errcode.Waiting) || e.Err.RetryAfter != 8 {
		t.Fatalf("wait end: %+v", e)
	}
	// A queued acquire that times out learns when to come back too.
	h.one(attempt(acq("k", "t3", "late", 10_000, 1_000), "L"))
	h.now += 1_000
	h.rec.events = nil
	h.one(sweep())
	e = events(h, EventWaitEnded)["late"]
	if e == nil || e.Attempt != "L" || e.Err.RetryAfter != 7 {
		t.Fatalf("timeout: %+v", e)
	}
	checkInvariants(t, h)
}

// Release answers: from the lease while it holds the key, from the recorded
// decision after, like lockd when nothing is known.
func TestReleaseAnswers(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	h.one(update(l, `{"v":1}`))
	wrongToken := release(l, false)
	wrongToken.Release.Token = 9
	wantCode(t, h.one(wrongToken), errcode.LeaseMismatch)
	otherLease := release(l, false)
	otherLease.Release.LeaseID = "not-the-lease"
	wantCode(t, h.one(otherLease), errcode.LeaseMismatch)
	otherTxn := release(l, false)
	otherTxn.Release.TxnID = "t9"
	wantCode(t, h.one(otherTxn), errcode.TxnMismatch)
	if d := h.publicDoc("k"); d.Exists {
		t.Fatal("a rejected release committed")
	}
	if r := h.one(release(l, false)); !r.Released || r.Decision != TxnCommit {
		t.Fatalf("%+v", r)
	}
	if r := h.one(release(l, false)); !r.Released || r.Decision != TxnCommit {
		t.Fatalf("retried release: %+v", r)
	}
	wantCode(t, h.one(release(l, true)), errcode.TxnCommitted)
	// A transaction nobody knows (forgotten, or never there): released.
	gone := release(&LeaseInfo{Namespace: "default", Key: "k", LeaseID: "old", TxnID: "t-unknown"}, false)
	before := h.hashWithoutMeta()
	if r := h.one(gone); r.Err != nil || !r.Released || r.Decision != "" {
		t.Fatalf("release of an unknown transaction: %+v", r)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("release of an unknown transaction changed the state")
	}
	// Rolled back on purpose, then asked to commit.
	l2 := mustLease(t, h.one(acq("k", "t2", "r2", 10_000, 0)))
	h.one(release(l2, true))
	wantCode(t, h.one(release(l2, false)), errcode.TxnRolledBack)
}

// A decision is kept for the retention the sweep is given (sweep(): 60 s)
// and answers retries until then; afterwards the sweep forgets it.
func TestDecisionsAreKeptForTheRetention(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	h.one(release(l, true))
	decided := h.now
	var next int64
	_ = h.f.View(func(v *View) error { next, _ = v.NextDeadline(60_000); return nil })
	if next != decided+60_000 {
		t.Fatalf("the sweeper is due at %d, want %d", next, decided+60_000)
	}
	h.now = decided + 59_999
	if r := h.one(sweep()); r.Sweep.Forgotten != 0 {
		t.Fatalf("forgotten within the retention: %+v", r.Sweep)
	}
	// Still final: a commit of the rolled back transaction is refused.
	wantCode(t, h.one(release(l, false)), errcode.TxnRolledBack)
	h.now = decided + 60_000
	if r := h.one(sweep()); r.Sweep.Forgotten != 1 {
		t.Fatalf("after the retention: %+v", r.Sweep)
	}
	if tr := txnOf(h, "t1"); tr != nil {
		t.Fatalf("decision kept past its retention: %+v", tr)
	}
	// Forgotten: a late release of the gone lease is done, as in lockd.
	if r := h.one(release(l, false)); r.Err != nil || !r.Released || r.Decision != "" {
		t.Fatalf("late release: %+v", r)
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
	if r.Err.CurrentVersion != 1 || r.Err.CurrentETag != etagOf(`{"x":1}`) {
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
	seed := testSeed(t)
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
	seed := testSeed(t)
	g := newGen(seed)
	a := openHarness(t, t.TempDir())
	var logs []*raft.Log
	var answers [][]byte
	now := int64(1_000_000)
	tokens := tokenOrder{}
	for i := 0; i < 2000; i++ {
		now += g.rng.Int64N(400)
		c := g.next()
		c.Now = now
		l := logOf(t, uint64(i+1), c)
		logs = append(logs, l)
		seen := len(a.rec.events)
		r := a.f.ApplyBatch([]*raft.Log{l})[0].(*Result)
		g.learn(r)
		answers = append(answers, mustJSON(t, r))
		// Fencing tokens only grow, whatever was forgotten meanwhile.
		tokens.check(t, seed, r.Lease)
		for _, e := range a.rec.events[seen:] {
			if e.Kind == EventGranted {
				tokens.check(t, seed, e.Lease)
			}
		}
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
	// Whatever the commands left behind passes the checks of a backup.
	if _, err := CheckBackupFile(snapshotFile(t, a)); err != nil {
		t.Fatalf("seed %d: a backup of the state is refused: %v", seed, err)
	}

	// The same commands packed into entries (EncodePacked), several entries
	// per batch: the same state, and every command the same answer.
	c := openHarness(t, t.TempDir())
	var packed []*raft.Log
	var first []int // index into logs of each packed entry's first command
	for i := 0; i < len(logs); {
		n := min(1+rng.IntN(40), len(logs)-i)
		cmds := make([][]byte, n)
		for j := range cmds {
			cmds[j] = logs[i+j].Data
		}
		packed = append(packed, &raft.Log{Index: uint64(len(packed) + 1), Term: 1, Type: raft.LogCommand, Data: EncodePacked(cmds)})
		first = append(first, i)
		i += n
	}
	for i := 0; i < len(packed); {
		n := min(1+rng.IntN(8), len(packed)-i)
		for j, out := range c.f.ApplyBatch(packed[i : i+n]) {
			for k, r := range out.(Results) {
				at := first[i+j] + k
				if got := mustJSON(t, r); !bytes.Equal(got, answers[at]) {
					t.Fatalf("seed %d: command %d answered %s packed, %s alone", seed, at, got, answers[at])
				}
			}
		}
		i += n
	}
	if !bytes.Equal(a.hashWithoutMeta(), c.hashWithoutMeta()) {
		t.Fatalf("seed %d: state differs between one command per entry and packed entries", seed)
	}
}

// tokenOrder checks that each key's leases come with growing fencing
// tokens: a lease never has a token below an earlier one's, nor another
// lease's token.
type tokenOrder map[string]*LeaseInfo

func (o tokenOrder) check(t *testing.T, seed int64, l *LeaseInfo) {
	t.Helper()
	if l == nil {
		return
	}
	k := l.Namespace + "\x00" + l.Key
	last := o[k]
	switch {
	case last == nil || l.Token > last.Token:
		o[k] = l
	case l.LeaseID == last.LeaseID && l.Token == last.Token:
	default:
		t.Fatalf("seed %d: %s/%s: lease %s with token %d after lease %s with token %d", seed, l.Namespace, l.Key,
			l.LeaseID, l.Token, last.LeaseID, last.Token)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// An entry of a format newer than this build's comes from a newer leader:
// the node stops instead of recording it as malformed, which the newer
// nodes would not do.
func TestANewerEntryFormatStopsTheNode(t *testing.T) {
	for _, data := range [][]byte{{EntryFormat + 1, '{', '}', '\n'}, EncodePacked([][]byte{{EntryFormat + 1}})} {
		var fatal error
		f, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{Fatal: func(err error) { fatal = err }})
		if err != nil {
			t.Fatal(err)
		}
		f.ApplyBatch([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: data}})
		if fatal == nil || !strings.Contains(fatal.Error(), "newer") {
			t.Fatalf("%q: the node did not stop (%v)", data, fatal)
		}
		if f.Applied() != 0 {
			t.Fatalf("%q: applied index moved to %d", data, f.Applied())
		}
		_ = f.Close()
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

func TestRestartSkipsTheLastAppliedEntry(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	// The last entry is one that a second application would change: the
	// dequeue would deliver the other message as well.
	h.run(enq("q", "m1", "a"), enq("q", "m2", "b"))
	last := deq("q", "r1", 0)
	last.Now = h.now
	mustDeliver(t, h.f.ApplyBatch([]*raft.Log{logOf(t, 3, last)})[0].(*Result))
	want := h.hash()
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	h2 := openHarness(t, dir)
	if h2.f.Applied() != 3 {
		t.Fatalf("applied=%d", h2.f.Applied())
	}
	h2.f.ApplyBatch([]*raft.Log{logOf(t, 3, last)})
	if st := h2.stats("q"); st.InFlight != 1 || st.Ready != 1 {
		t.Fatalf("after replaying the last applied entry: %+v", st)
	}
	if !bytes.Equal(want, h2.hash()) {
		t.Fatal("the last applied entry was applied again")
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

// snapshotBytes persists a snapshot of h's state.
func snapshotBytes(t *testing.T, h *harness) []byte {
	t.Helper()
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return persisted(t, snap)
}

// persisted persists and releases snap.
func persisted(t *testing.T, snap raft.FSMSnapshot) []byte {
	t.Helper()
	defer snap.Release()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	return sink.Bytes()
}

// restoredFrom is a new state machine restored from a snapshot stream.
func restoredFrom(t *testing.T, stream []byte) *harness {
	t.Helper()
	h := openHarness(t, t.TempDir())
	if err := h.f.Restore(io.NopCloser(bytes.NewReader(stream))); err != nil {
		t.Fatal(err)
	}
	return h
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
	// Applies continue after Snapshot; Persist writes the state as it is
	// when it begins, entry 5 included.
	src.one(acq("k3", "t3", "r3", 10_000, 0))
	dst := restoredFrom(t, persisted(t, snap))
	if dst.f.Applied() != 5 {
		t.Fatalf("applied after restore = %d, want 5", dst.f.Applied())
	}
	if d := dst.publicDoc("k"); string(d.Bytes) != `{"a":1}` {
		t.Fatalf("restored doc: %+v", d)
	}
	// raft replays the entry after the snapshot's index (4): the state
	// already holds it, so it is skipped and the states agree.
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

// leaderSnapshotAndFollower returns a harness with one state (a leader's),
// its snapshot, and a harness with another state (a follower's) to restore
// it into.
func leaderSnapshotAndFollower(t *testing.T) (src *harness, leader []byte, dst *harness) {
	src = openHarness(t, t.TempDir())
	mustLease(t, src.one(acq("from-leader", "t1", "r1", 10_000, 0)))
	leader = snapshotBytes(t, src)
	dst = openHarness(t, t.TempDir())
	mustLease(t, dst.one(acq("own", "t2", "r2", 10_000, 0)))
	return src, leader, dst
}

// A snapshot raft holds between Snapshot and Persist (while its main loop
// installs the leader's snapshot) does not keep that Restore from replacing
// the state, and it then fails to persist instead of writing a state that
// replaced the one it was taken of.
func TestRestoreEndsSnapshotsLeftOpen(t *testing.T) {
	src, leader, dst := leaderSnapshotAndFollower(t)
	open, err := dst.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := make(chan error, 1)
	go func() { restored <- dst.f.Restore(io.NopCloser(bytes.NewReader(leader))) }()
	select {
	case err := <-restored:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		open.Release()
		<-restored
		t.Fatal("the restore waited for a snapshot left open")
	}
	if !bytes.Equal(src.hash(), dst.hash()) {
		t.Fatal("restored state differs from the leader's")
	}
	var stale memSink
	if err := open.Persist(&stale); err == nil || !stale.cancelled {
		t.Fatalf("a snapshot of the replaced state persisted: %v", err)
	}
	open.Release()
	if len(snapshotBytes(t, dst)) == 0 {
		t.Fatal("an empty snapshot after the restore")
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
	sweepCmd, _ := Encode(sweep())
	// A command framed with another entry format than its own: an older
	// build would have applied it otherwise.
	var misframed [][]byte
	for _, c := range []struct {
		cmd    *Command
		format byte
	}{{sweep(), formatV3}, {sweep(), formatV4},
		{&Command{Op: OpDropWaits, DropWaits: &DropWaitsCmd{Node: "n", Run: "r"}}, formatV1},
		{&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 1, KeepTip: true}}, formatV1},
		{&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 1, KeepTip: true}}, formatV3},
		{&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 1}}, formatV4},
		{&Command{Op: OpForgetKeys, ForgetKeys: &ForgetKeysCmd{Keys: []KeyName{{Namespace: "default", Key: "k"}}}}, formatV1},
		{&Command{Op: OpForgetKeys, ForgetKeys: &ForgetKeysCmd{Keys: []KeyName{{Namespace: "default", Key: "k"}}}}, formatV4},
		{sweep(), formatV5}, {sweep(), formatV6},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV6}}, formatV1},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV6}}, formatV5},
		{sweep(), formatV7},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV7}}, formatV6},
		{sweep(), formatV8},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV8}}, formatV7},
		{sweep(), formatV9},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV9}}, formatV8},
		{sweep(), formatV10},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV10}}, formatV9},
		{sweep(), formatV11},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV11}}, formatV10},
		{sweep(), formatV12},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV12}}, formatV11},
		{sweep(), formatV13},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV13}}, formatV12},
		{sweep(), formatV14},
		{&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: formatV14}}, formatV13}} {
		data, err := Encode(c.cmd)
		if err != nil {
			t.Fatal(err)
		}
		misframed = append(misframed, append([]byte{c.format}, data[1:]...))
	}
	for _, data := range append([][]byte{nil, {0}, {formatV1}, []byte("\x01{}\n"), []byte("\x01{\"op\":\"acquire\"}\n"),
		[]byte("\x01{\"op\":\"nope\",\"sweep\":{\"limit\":1}}\n"), []byte("\x01{\"op\":\"sweep\",\"sweep\":{\"limit\":1}}\nxx"),
		{formatPacked}, {formatPacked, 0}, {formatPacked, 1}, {formatPacked, 1, 5, 'x'}, {formatPacked, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		append(EncodePacked([][]byte{sweepCmd}), 0), EncodePacked([][]byte{EncodePacked([][]byte{sweepCmd})})}, misframed...) {
		h.index++
		before := h.hashWithoutMeta()
		out := h.f.ApplyBatch([]*raft.Log{{Index: h.index, Term: 1, Type: raft.LogCommand, Data: data}})[0]
		r, ok := out.(*Result)
		if rs, packed := out.(Results); packed && len(rs) == 1 {
			r, ok = rs[0], true
		}
		if !ok || r.Err == nil {
			t.Fatalf("%q accepted", data)
		}
		if !bytes.Equal(before, h.hashWithoutMeta()) {
			t.Fatalf("%q changed the state", data)
		}
	}
}

// FuzzDecode decodes arbitrary log entries and applies each to a fresh state
// machine that already holds leases, a waiter, a document, a delivery and
// transactions (fuzzPrelude): nothing panics, a rejected entry changes no
// bucket and the cross-bucket invariants hold afterwards.
func FuzzDecode(f *testing.F) {
	var all [][]byte
	for _, c := range fuzzSeeds() {
		data, err := Encode(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		all = append(all, data)
	}
	f.Add(EncodePacked(all))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, decErr := Decode(data)
		if decErr == nil {
			again, err := Encode(c)
			if err != nil {
				t.Fatalf("decoded command does not encode: %v", err)
			}
			if _, err := Decode(again); err != nil {
				t.Fatalf("re-encoded command does not decode: %v", err)
			}
		}
		h := openHarness(t, fuzzDir(t))
		for i, r := range h.run(fuzzPrelude()...) {
			if r.Err != nil {
				t.Fatalf("prelude step %d: %v", i, r.Err)
			}
		}
		if len(data) > 0 && data[0] > EntryFormat {
			return // a newer format stops the node: TestANewerEntryFormatStopsTheNode
		}
		before := h.hashWithoutMeta()
		h.index++
		out := h.f.ApplyBatch([]*raft.Log{{Index: h.index, Term: 1, Type: raft.LogCommand, Data: data}})[0]
		if rs, packed := out.(Results); packed {
			samePackedOrNot(t, data, rs, h)
			return
		}
		r := out.(*Result)
		if decErr != nil && r.Err == nil {
			t.Fatalf("an entry Decode rejects (%v) was applied", decErr)
		}
		if r.Err != nil && !bytes.Equal(before, h.hashWithoutMeta()) {
			t.Fatalf("rejected entry (%v) changed the state", r.Err)
		}
		if err := invariants(h); err != nil {
			t.Fatalf("after %v: %v", r.Err, err)
		}
	})
}

// samePackedOrNot applies the commands of the packed entry data, each as an
// entry of its own, to a second state machine with the fuzz prelude, and
// fails unless every answer and the state are those packed gave (rs, h).
func samePackedOrNot(t *testing.T, data []byte, rs Results, h *harness) {
	t.Helper()
	cmds, err := unpack(data)
	if err != nil || len(cmds) != len(rs) {
		t.Fatalf("packed entry answered %d results for %d commands (%v)", len(rs), len(cmds), err)
	}
	for _, c := range cmds {
		if len(c) > 0 && c[0] > EntryFormat {
			t.Fatalf("a command of a newer format inside a packed entry was applied")
		}
	}
	alone := openHarness(t, fuzzDir(t))
	alone.run(fuzzPrelude()...)
	for i, c := range cmds {
		alone.index++
		r := alone.f.ApplyBatch([]*raft.Log{{Index: alone.index, Term: 1, Type: raft.LogCommand, Data: c}})[0].(*Result)
		if !bytes.Equal(mustJSON(t, r), mustJSON(t, rs[i])) {
			t.Fatalf("command %d answered %s alone, %s packed", i, mustJSON(t, r), mustJSON(t, rs[i]))
		}
	}
	if !bytes.Equal(alone.hashWithoutMeta(), h.hashWithoutMeta()) {
		t.Fatal("packed and unpacked commands left different states")
	}
	if err := invariants(h); err != nil {
		t.Fatal(err)
	}
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
	wantCode(t, h.one(release(b, false)), errcode.TxnRolledBack)
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

// A lease that has run out is not handed out again by an acquire, even
// before the sweeper rolled its transaction back: its transaction cannot
// join keys any more, and a retry of the request that obtained it waits
// for the key like any other acquirer.
func TestAcquireDoesNotHandOutAnExpiredLease(t *testing.T) {
	h := openHarness(t, t.TempDir())
	mustLease(t, h.one(acq("a", "tx", "r1", 1_000, 0)))
	h.now += 1_500
	wantCode(t, h.one(acq("a", "tx", "join-a", 10_000, 0)), errcode.TxnRolledBack)
	wantCode(t, h.one(acq("c", "tx", "join-c", 10_000, 0)), errcode.TxnRolledBack)
	var c KeyRecord
	_ = h.f.View(func(v *View) error { c, _ = v.Key("default", "c"); return nil })
	if c.Lease != nil {
		t.Fatalf("a transaction with an expired lease was granted another key: %+v", c.Lease)
	}
	wantCode(t, h.one(acq("a", "t-retry", "r1", 10_000, 0)), errcode.Waiting)
	if r := h.one(acq("a", "t-retry", "r1", 10_000, 5_000)); !r.Queued {
		t.Fatalf("a retry of the expired lease's request: %+v (err %v), want it queued", r, r.Err)
	}
	h.rec.events = nil
	h.one(sweep())
	g := events(h, EventGranted)["r1"]
	if g == nil || g.Lease.TxnID != "t-retry" || g.Lease.Token != 2 || g.Lease.ExpiresAt != h.now+10_000 {
		t.Fatalf("the retry was not granted a new lease when the expired one was swept: %+v", h.rec.events)
	}
	checkInvariants(t, h)
}

// A key is not handed on to a queued acquirer whose transaction has an
// expired lease elsewhere: the next acquirer in line gets it.
func TestHandOffSkipsATransactionWithAnExpiredLease(t *testing.T) {
	h := openHarness(t, t.TempDir())
	mustLease(t, h.one(acq("a", "doomed", "r-a", 1_000, 0)))
	held := mustLease(t, h.one(acq("b", "holder", "r-b", 10_000, 0)))
	for _, r := range h.run(acq("b", "doomed", "w-doomed", 10_000, 60_000), acq("b", "next", "w-next", 10_000, 60_000)) {
		if !r.Queued {
			t.Fatalf("acquire of a held key: %+v (err %v), want it queued", r, r.Err)
		}
	}
	h.now += 1_500 // the doomed transaction's lease on a has run out; no sweep yet
	h.rec.events = nil
	if r := h.one(release(held, false)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if e := events(h, EventWaitEnded)["w-doomed"]; e == nil || !errors.Is(e.Err, errcode.TxnRolledBack) {
		t.Fatalf("the doomed transaction's wait did not end with txn_rolled_back: %+v", h.rec.events)
	}
	if g := events(h, EventGranted)["w-next"]; g == nil || g.Lease.TxnID != "next" {
		t.Fatalf("the key did not go to the next acquirer in line: %+v", h.rec.events)
	}
	checkInvariants(t, h)
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
		if err := countsEqualAWalk(v); err != nil {
			return err
		}
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
				tr := v.Txn(rec.Lease.TxnID)
				if tr == nil || tr.State != TxnPending {
					return fmt.Errorf("lease on %q belongs to a decided or unknown txn", k)
				}
				if v.tx.Bucket(bucketLeaseExp).Get(timerKey(rec.Lease.ExpiresAt, k)) != nil {
					leases++
				} else if tr.Home == "" {
					// Only a prepared participant outlives its expiry,
					// locked until its coordinator decides.
					return fmt.Errorf("lease on %q lacks its expiry index", k)
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

// testSeed is the random seed of a generated test: RAFTLOCKD_FSM_SEED when
// set (to rerun a failure), the clock otherwise. It is logged.
func testSeed(t *testing.T) int64 {
	seed := time.Now().UnixNano()
	if v := os.Getenv("RAFTLOCKD_FSM_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("RAFTLOCKD_FSM_SEED: %v", err)
		}
	}
	t.Logf("seed %d (rerun with RAFTLOCKD_FSM_SEED=%d)", seed, seed)
	return seed
}

// A state file another process (or another node in this one) holds is
// refused with that reason, not a bare timeout.
func TestOpenSaysAnotherProcessHoldsTheStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, err := Open(path, Options{BootID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if g, err := Open(path, Options{BootID: "b"}); err == nil {
		g.Close()
		t.Fatal("a held state file was opened twice")
	} else if !strings.Contains(err.Error(), "another process holds it") {
		t.Fatalf("opening a held state file: %v", err)
	}
}
