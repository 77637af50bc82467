package fsm

import (
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// Entry format 10 bounds a keepalive by the maximum TTL it carries (the
// proposing server's --max-ttl): a lease acquired under a longer maximum
// is kept alive for the maximum in force, which is its TTL from then on.
// Until the island follows format 10 the maximum is ignored, as builds of
// format 9 ignore it.
func TestAKeepaliveIsBoundedByTheMaximumItCarries(t *testing.T) {
	for _, rules := range []int{formatV9, formatV10} {
		h := rulesHarness(t, rules)
		l := mustLease(t, h.one(acq("k", "t1", "r1", 3_600_000, 0)))
		keep := func(ttl, maxTTL int64) int64 {
			t.Helper()
			h.now += 1_000
			r := h.one(&Command{Op: OpKeepAlive, KeepAlive: &KeepAliveCmd{Namespace: l.Namespace, Key: l.Key,
				LeaseID: l.LeaseID, TxnID: l.TxnID, TTL: ttl, Max: maxTTL}})
			return mustLease(t, r).ExpiresAt - h.now
		}
		want := int64(3_600_000)
		if rules >= formatV10 {
			want = 60_000
		}
		if got := keep(0, 60_000); got != want {
			t.Fatalf("rules %d: a keepalive of the lease's own TTL under a maximum of 60s: extended by %d ms, want %d", rules, got, want)
		}
		// The lease's TTL is the maximum from then on, for a server
		// whose maximum is longer too.
		if got := keep(0, 0); got != want {
			t.Fatalf("rules %d: the next keepalive: extended by %d ms, want %d", rules, got, want)
		}
		if got := keep(30_000, 60_000); got != 30_000 {
			t.Fatalf("rules %d: a keepalive of 30s: extended by %d ms", rules, got)
		}
		checkInvariants(t, h)
	}
}

// Entry format 10 checks an ETag condition given as the empty ETag
// (X-If-State-ETag: ""): the holder's view must hold no document. Until the
// island follows format 10, such a write applies as builds of format 9
// apply it, without the check.
func TestAnEmptyETagConditionAsksForNoDocument(t *testing.T) {
	ifEmpty := func(c *Command) *Command {
		c.Write.IfETagSet = true
		return c
	}
	for _, rules := range []int{formatV9, formatV10} {
		h := rulesHarness(t, rules)
		l := mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
		if r := h.one(ifEmpty(update(l, `{"n":1}`))); r.Err != nil {
			t.Fatalf("rules %d: a write to an absent document: %v", rules, r.Err)
		}
		h.one(release(l, false))
		l = mustLease(t, h.one(acq("k", "t2", "r2", 10_000, 0)))
		r := h.one(ifEmpty(update(l, `{"n":2}`)))
		if rules < formatV10 {
			if r.Err != nil {
				t.Fatalf("rules %d: %v, want the write applied as older builds apply it", rules, r.Err)
			}
			continue
		}
		wantCode(t, r, errcode.ETagMismatch)
		if r.Err.CurrentVersion != 1 || r.Err.CurrentETag != etagOf(`{"n":1}`) {
			t.Fatalf("rules %d: conflict lacks the current state: %+v", rules, r.Err)
		}
		wantCode(t, h.one(ifEmpty(rmv(l))), errcode.ETagMismatch)
		if r := h.one(rmv(l)); r.Err != nil || !r.Write.Removed {
			t.Fatalf("rules %d: remove: %+v", rules, r)
		}
		// The staged removal empties the holder's view.
		if r := h.one(ifEmpty(update(l, `{"n":3}`))); r.Err != nil || r.Write.Version != 2 {
			t.Fatalf("rules %d: a write after a staged removal: %+v (%v)", rules, r.Write, r.Err)
		}
	}
}

func rmv(l *LeaseInfo) *Command {
	return &Command{Op: OpWrite, Write: &WriteCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID, TxnID: l.TxnID, Delete: true}}
}
