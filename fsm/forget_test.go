package fsm

import (
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

func (h *harness) forgettable() []KeyName {
	h.t.Helper()
	var keys []KeyName
	if err := h.f.View(func(v *View) error {
		var next []byte
		for {
			var got []KeyName
			got, next = v.ForgettableKeys(next, 2, 3) // small pages: the walk resumes
			keys = append(keys, got...)
			if next == nil {
				return nil
			}
		}
	}); err != nil {
		h.t.Fatal(err)
	}
	return keys
}

func (h *harness) forget(keys ...KeyName) *Result {
	return h.one(&Command{Op: OpForgetKeys, ForgetKeys: &ForgetKeysCmd{Keys: keys}})
}

func (h *harness) keyExists(key string) bool {
	var ok bool
	_ = h.f.View(func(v *View) error { _, ok = v.Key("default", key); return nil })
	return ok
}

func name(key string) KeyName { return KeyName{Namespace: "default", Key: key} }

// A key that held only leases is forgotten, and counts its fencing tokens
// on from where it was (and so does every key without a record); a key
// with a lease, a queued acquirer or a document (now or once) is kept.
func TestForgottenKeysCountOnFromTheFloor(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for i := range 3 {
		l := mustLease(t, h.one(acq("lock", "t-lock"+string(rune('a'+i)), "lock"+string(rune('a'+i)), 10_000, 0)))
		h.one(release(l, false))
	}
	held := mustLease(t, h.one(acq("held", "t-held", "held", 10_000, 0)))
	h.one(acq("held", "t-wait", "wait", 10_000, 5_000)) // queued behind it
	doc := mustLease(t, h.one(acq("doc", "t-doc", "doc", 10_000, 0)))
	h.one(update(doc, `{"a":1}`))
	h.one(release(doc, false))
	gone := mustLease(t, h.one(acq("gone", "t-gone", "gone", 10_000, 0)))
	h.one(update(gone, `{"a":1}`))
	h.one(release(gone, false))
	g2 := mustLease(t, h.one(acq("gone", "t-gone2", "gone2", 10_000, 0)))
	h.one(&Command{Op: OpWrite, Write: &WriteCmd{Namespace: "default", Key: "gone", LeaseID: g2.LeaseID, TxnID: g2.TxnID, Delete: true}})
	h.one(release(g2, false))
	if held.Token != 1 {
		t.Fatalf("first token of held = %d", held.Token)
	}

	got := h.forgettable()
	if len(got) != 1 || got[0] != name("lock") {
		t.Fatalf("forgettable = %v, want only lock", got)
	}
	before := h.hashWithoutMeta()
	if r := h.forget(name("held"), name("doc"), name("gone"), name("never")); r.Err != nil || r.Forgotten != 0 {
		t.Fatalf("forgetting kept keys: %+v", r)
	}
	if string(before) != string(h.hashWithoutMeta()) {
		t.Fatal("forgetting nothing changed the state")
	}
	if r := h.forget(name("lock")); r.Err != nil || r.Forgotten != 1 {
		t.Fatalf("forget lock: %+v", r)
	}
	if h.keyExists("lock") || len(h.forgettable()) != 0 {
		t.Fatal("lock still has a record")
	}
	checkInvariants(t, h)

	// Counting goes on: the forgotten key, and a key never seen, start
	// above every token the forgotten key was given.
	if l := mustLease(t, h.one(acq("lock", "t-again", "again", 10_000, 0))); l.Token != 4 {
		t.Fatalf("token after forgetting = %d, want 4", l.Token)
	}
	if l := mustLease(t, h.one(acq("fresh", "t-fresh", "fresh", 10_000, 0))); l.Token != 4 {
		t.Fatalf("token of a new key = %d, want 4", l.Token)
	}
	// A key acquired between the listing and the forgetting is kept.
	if r := h.forget(name("lock")); r.Forgotten != 0 || !h.keyExists("lock") {
		t.Fatalf("a held key was forgotten: %+v", r)
	}
	// Keys with records count on from their own counters.
	h.one(release(held, false)) // hands held to the queued acquirer
	if l := mustLease(t, h.one(acq("doc", "t-doc2", "doc2", 10_000, 0))); l.Token != 2 {
		t.Fatalf("token of doc = %d, want 2", l.Token)
	}
	checkInvariants(t, h)

	for _, bad := range []*ForgetKeysCmd{{}, {Keys: []KeyName{{Namespace: "", Key: "k"}}}, {Keys: make([]KeyName, MaxForget+1)}} {
		before := h.hashWithoutMeta()
		wantCode(t, h.one(&Command{Op: OpForgetKeys, ForgetKeys: bad}), errcode.MalformedCmd)
		if string(before) != string(h.hashWithoutMeta()) {
			t.Fatal("a refused forget changed the state")
		}
	}
}

// A restore never lets a forgotten key's tokens repeat: the file's keys
// count on from at least the current floor.
func TestRestoreKeepsTheFloorOfForgottenKeys(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("k", "t0", "r0", 10_000, 0)))
	h.one(release(l, false))
	backup := snapshotFile(t, h) // k at token 1
	for i := range 4 {
		l := mustLease(t, h.one(acq("k", "t-more"+string(rune('a'+i)), "more"+string(rune('a'+i)), 10_000, 0)))
		h.one(release(l, false))
	}
	if r := h.forget(name("k")); r.Forgotten != 1 {
		t.Fatalf("forget: %+v", r)
	}
	dst := openHarness(t, t.TempDir())
	restoreInto(t, h, dst, backup)
	if l := mustLease(t, dst.one(acq("k", "t-after", "after", 10_000, 0))); l.Token != 6 {
		t.Fatalf("token after restoring = %d, want 6", l.Token)
	}
	if l := mustLease(t, dst.one(acq("new", "t-new", "new", 10_000, 0))); l.Token != 6 {
		t.Fatalf("token of a new key after restoring = %d, want 6", l.Token)
	}
}

// A message's state sidecar is forgotten once the message is gone and the
// sidecar's document with it; while the message stays, so does its
// sidecar's record.
func TestTheSidecarOfAGoneMessageIsForgotten(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(enq("q", "m1", "x"))
	m := mustDeliver(t, h.one(statefulDeq("q", "r1", "sl-1", "st-1")))
	h.one(update(m.State, `{"step":1}`))
	h.one(nackCmd(ref(m)))
	sidecar := StateKey("q", "m1")
	if got := h.forgettable(); len(got) != 0 {
		t.Fatalf("forgettable while the sidecar holds a document: %v", got)
	}
	m = mustDeliver(t, h.one(statefulDeq("q", "r2", "sl-2", "st-2")))
	token := m.State.Token
	if r := h.one(ackCmd(ref(m))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := h.forgettable(); len(got) != 1 || got[0] != name(sidecar) {
		t.Fatalf("forgettable after the ack = %v, want the sidecar", got)
	}
	if r := h.forget(name(sidecar)); r.Forgotten != 1 || h.keyExists(sidecar) {
		t.Fatalf("the sidecar of an acknowledged message was kept: %+v", r)
	}
	// Should the message come back (a restore), its sidecar counts on.
	h.one(enq("q", "m1", "again"))
	m = mustDeliver(t, h.one(statefulDeq("q", "r3", "sl-3", "st-3")))
	if m.State.Token <= token {
		t.Fatalf("sidecar token %d after forgetting, was %d", m.State.Token, token)
	}
	checkInvariants(t, h)
}
