package fsm

import "testing"

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
