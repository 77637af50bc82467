package fsm

import (
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
)

// A key of a message's shape names the message: it cannot be acquired, and
// as a participant it never stands for a key, so committing a transaction
// never mistakes one for the other.
func TestMessageShapedKeysNameMessages(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("jobs", "m1", "body"))
	wantCode(t, h.one(acq(MessageKey("jobs", "m1"), "t1", "r1", 60_000, 0)), errcode.InvalidKey)
	wantCode(t, h.one(acq(MessageKey("jobs", "absent"), "t1", "r2", 60_000, 0)), errcode.InvalidKey)

	// A pending decision naming an absent message locks no key of that name.
	c := decideCmd("t2", TxnPending, local(MessageKey("jobs", "absent")), local("k"))
	c.Decide.ExpiresAt = h.now + 10_000
	if r := h.one(c); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("pending: %+v", r)
	}
	var exists bool
	_ = h.f.View(func(v *View) error { _, exists = v.Key("default", MessageKey("jobs", "absent")); return nil })
	if exists {
		t.Fatal("a message-shaped participant became a key")
	}
	if r := h.one(decideCmd("t2", TxnCommit)); r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("commit: %+v", r)
	}
	checkInvariants(t, h)
}

// Identifiers that end up inside a state file key are bounded: an entry
// with an oversized one is refused, so a later sweep cannot fail on it.
func TestOversizedDeliveryLeaseIsRefused(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "body"))
	c := deq("q", "r1", 0)
	c.Dequeue.LeaseID = strings.Repeat("l", 40<<10)
	wantCode(t, h.one(c), errcode.MalformedCmd)
	d := decideCmd("t1", TxnPending, local(MessageKey("q", "m1")))
	d.Decide.ExpiresAt, d.Decide.LeaseID = h.now+10_000, strings.Repeat("l", 40<<10)
	wantCode(t, h.one(d), errcode.MalformedCmd)
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("a refused dequeue changed the queue: %+v", st)
	}
}

// A dequeue with state does not take a sidecar whose expired lease has
// queued acquirers: ending that lease hands the key to the first of them.
func TestStatefulDequeueLeavesAClaimedSidecarAlone(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "body"))
	sidecar := StateKey("q", "m1")
	mustLease(t, h.one(acq(sidecar, "t1", "r1", 1_000, 0)))
	if r := h.one(acq(sidecar, "t2", "r2", 60_000, 60_000)); !r.Queued {
		t.Fatalf("not queued: %+v", r)
	}
	h.now += 2_000 // the lease expired; no sweep ran yet
	c := statefulDeq("q", "r3", "sl-r3", "ts")
	wantCode(t, h.one(c), errcode.Waiting)
	if st := h.stats("q"); st.Ready != 1 {
		t.Fatalf("the message must stay ready: %+v", st)
	}
	// Once the sweep hands the sidecar to the waiter, it is held.
	h.one(sweep())
	var rec KeyRecord
	_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", sidecar); return nil })
	if rec.Lease == nil || rec.Lease.TxnID != "t2" {
		t.Fatalf("the waiter must hold the sidecar: %+v", rec.Lease)
	}
	c.Dequeue.RequestID = "r4"
	wantCode(t, h.one(c), errcode.Waiting)
}

// A pending decision that asks for a later expiry extends the holds the
// transaction already has, keys and deliveries alike, so it is not rolled
// back at the first expiry.
func TestLaterPendingDecisionExtendsItsHolds(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "body"))
	first := decideCmd("t1", TxnPending, local("a"), local(MessageKey("q", "m1")))
	first.Decide.ExpiresAt = h.now + 10_000
	if r := h.one(first); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("pending: %+v", r)
	}
	h.now += 5_000
	again := decideCmd("t1", TxnPending, local("a"), local(MessageKey("q", "m1")))
	again.Decide.ExpiresAt = h.now + 60_000
	if r := h.one(again); r.Err != nil || r.Txn.ExpiresAt != h.now+60_000 {
		t.Fatalf("extension: %+v", r)
	}
	h.now += 10_000 // past the first expiry
	if r := h.one(sweep()); r.Sweep.Expired != 0 {
		t.Fatalf("the sweep rolled back an extended transaction: %+v", r.Sweep)
	}
	if tr := txnOf(h, "t1"); tr.State != TxnPending {
		t.Fatalf("t1 is %s", tr.State)
	}
	if r := h.one(decideCmd("t1", TxnCommit)); r.Decision != TxnCommit {
		t.Fatalf("commit: %+v", r)
	}
	if st := h.stats("q"); st.Ready != 0 || st.InFlight != 0 {
		t.Fatalf("the commit must acknowledge m1: %+v", st)
	}
	checkInvariants(t, h)
}

// One sweep entry does at most its limit of work (plus one transaction's
// participants), in the presumed-abort and delivery-expiry passes too; the
// rest is left for the next sweep, which it says there is.
func TestSweepStopsAtItsBudget(t *testing.T) {
	h := openHarness(t, t.TempDir())
	const txns, keys = 3, 20
	for i := range txns {
		id := "p" + strconv.Itoa(i)
		var ps []Participant
		for j := range keys {
			ps = append(ps, local(id+"-k"+strconv.Itoa(j)))
		}
		c := decideCmd(id, TxnPending, ps...)
		c.Decide.ExpiresAt = h.now + 1_000
		h.one(c)
		h.one(enq("q", "m"+strconv.Itoa(i), "body"))
		d := deq("q", "r"+strconv.Itoa(i), 0)
		d.Dequeue.TxnID = "d" + strconv.Itoa(i)
		mustDeliver(t, h.one(d))
		for j := range keys {
			mustLease(t, h.one(acq("d"+strconv.Itoa(i)+"-k"+strconv.Itoa(j), d.Dequeue.TxnID, d.Dequeue.RequestID+"-"+strconv.Itoa(j), 600_000, 0)))
		}
	}
	h.now += 20_000 // every pending decision and every delivery expired
	small := &Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 3, TxnRetention: 60_000}}
	r := h.one(small)
	if r.Sweep.Expired != 1 || !r.Sweep.More {
		t.Fatalf("first sweep: %+v, want one transaction and more to do", r.Sweep)
	}
	sweeps := 1
	for ; r.Sweep.More && sweeps < 20; sweeps++ {
		small.Now = 0
		r = h.one(small)
	}
	for i := range txns {
		for _, id := range []string{"p" + strconv.Itoa(i), "d" + strconv.Itoa(i)} {
			if tr := txnOf(h, id); tr == nil || tr.State != TxnRollback {
				t.Fatalf("after %d sweeps %s is %+v", sweeps, id, tr)
			}
		}
	}
	checkInvariants(t, h)
}

// A restore never moves a message's delivery token or a coordinator's term
// back.
func TestPrepareRestoreKeepsMessageTokensAndTermsGrowing(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	h.one(enq("q", "m1", "body"))
	backup := snapshotFile(t, h)
	for i := range 3 {
		m := mustDeliver(t, h.one(deq("q", "r"+strconv.Itoa(i), 0)))
		h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
	}
	prep := &Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "tx", Home: "far", Term: 7, ExpiresAt: h.now + 10_000,
		LeaseID: "lx", Participants: []Participant{local("a")}}}
	if r := h.one(prep); r.Err != nil {
		t.Fatalf("prepare: %+v", r)
	}
	// A state written before the highest delivered token was kept counts
	// its messages' own counters.
	if err := h.f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaMsgTokens) }); err != nil {
		t.Fatal(err)
	}
	restoreBackup(t, h, backup)
	if m := mustDeliver(t, h.one(deq("q", "r9", 0))); m.Lease.Token != 4 {
		t.Fatalf("token after restore = %d, want 4", m.Lease.Token)
	}
	var term uint64
	_ = h.f.View(func(v *View) error { term = v.TCTerm("far"); return nil })
	if term != 7 {
		t.Fatalf("far's term after restore = %d, want 7", term)
	}
}

// A message the backup holds that was delivered and acknowledged since
// (so the current state has no record of it) comes back with a token above
// every one it was delivered with.
func TestPrepareRestoreRaisesTokensOfMessagesGoneSince(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "body"))
	backup := snapshotFile(t, h)
	var last int64
	for i := range 3 {
		m := mustDeliver(t, h.one(deq("q", "r"+strconv.Itoa(i), 0)))
		last = m.Lease.Token
		if i < 2 {
			h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
		} else if r := h.one(&Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(m)}}); r.Err != nil {
			t.Fatalf("ack: %+v", r.Err)
		}
	}
	restoreBackup(t, h, backup)
	if m := mustDeliver(t, h.one(deq("q", "r9", 0))); m.Lease.Token <= last {
		t.Fatalf("m1's token after the restore = %d, but it was delivered with %d before", m.Lease.Token, last)
	}
}

func stagedEnq(queue, id, txn string, ttl int64) *Command {
	c := enq(queue, id, "body")
	c.Enqueue.TxnID, c.Enqueue.TxnTTL = txn, ttl
	return c
}

// A transaction holding nothing but staged enqueues is rolled back once
// its last enqueue's hold ends, and its messages vanish; one that also
// holds a lease ends with the lease instead.
func TestStagedEnqueuesDoNotHoldATransactionForever(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(stagedEnq("q", "m1", "t1", 10_000))
	h.now += 8_000
	h.one(stagedEnq("q", "m2", "t1", 10_000)) // moves the hold to now + 10 s
	var when int64
	var ok bool
	_ = h.f.View(func(v *View) error { when, ok = v.NextDeadline(60_000); return nil })
	if !ok || when != h.now+10_000 {
		t.Fatalf("next deadline %d %v, want %d", when, ok, h.now+10_000)
	}
	h.now += 9_999
	if r := h.one(sweep()); r.Sweep.Expired != 0 || txnOf(h, "t1").State != TxnPending {
		t.Fatalf("rolled back before its hold ended: %+v", r.Sweep)
	}
	h.now++
	if r := h.one(sweep()); r.Sweep.Expired != 1 {
		t.Fatalf("sweep at the hold's end: %+v", r.Sweep)
	}
	if tr := txnOf(h, "t1"); tr.State != TxnRollback || tr.Reason != ReasonExpired {
		t.Fatalf("t1: %+v", tr)
	}
	if st := h.stats("q"); st.Ready != 0 || st.Staged != 0 {
		t.Fatalf("the staged messages must vanish: %+v", st)
	}

	// With a lease of its own, the transaction outlives the staged hold and
	// commits on release.
	l := mustLease(t, h.one(acq("k", "t2", "r2", 600_000, 0)))
	h.one(stagedEnq("q", "m3", "t2", 10_000))
	h.now += 60_000
	if r := h.one(sweep()); r.Sweep.Expired != 0 {
		t.Fatalf("a leased transaction was rolled back: %+v", r.Sweep)
	}
	if r := h.one(release(l, false)); !r.Released {
		t.Fatalf("release: %+v", r)
	}
	if st := h.stats("q"); st.Ready != 1 || st.Head.ID != "m3" {
		t.Fatalf("m3 must be visible after the commit: %+v", st)
	}
	checkInvariants(t, h)
}
