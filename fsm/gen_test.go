package fsm

import (
	"fmt"
	"math/rand/v2"
)

// gen produces random but plausible commands: a few keys, leases learned from
// earlier results (sometimes stale, sometimes forged), all operations.
type gen struct {
	rng    *rand.Rand
	n      int
	leases []*LeaseInfo
	reqs   []string
}

func newGen(seed int64) *gen { return &gen{rng: rand.New(rand.NewPCG(uint64(seed), 1))} }

func (g *gen) pick(s []string) string { return s[g.rng.IntN(len(s))] }

func (g *gen) lease() *LeaseInfo {
	if len(g.leases) == 0 || g.rng.IntN(10) == 0 {
		return &LeaseInfo{Namespace: g.pick([]string{"default", "other"}), Key: g.pick([]string{"a", "b", "c"}),
			LeaseID: "forged", TxnID: "forged"}
	}
	l := *g.leases[g.rng.IntN(len(g.leases))]
	return &l
}

func (g *gen) next() *Command {
	g.n++
	id := fmt.Sprintf("%d", g.n)
	switch g.rng.IntN(9) {
	case 0, 1:
		txn := "t" + id
		if len(g.leases) > 0 && g.rng.IntN(3) == 0 {
			txn = g.lease().TxnID
		}
		req := "r" + id
		if len(g.reqs) > 0 && g.rng.IntN(6) == 0 {
			req = g.pick(g.reqs)
		}
		g.reqs = append(g.reqs, req)
		c := acq(g.pick([]string{"a", "b", "c"}), txn, req, 200+g.rng.Int64N(2000), g.rng.Int64N(3)*500)
		c.Acquire.Namespace = g.pick([]string{"default", "other"})
		c.Acquire.IfNotExists = g.rng.IntN(5) == 0
		return c
	case 2:
		l := g.lease()
		c := &Command{Op: OpKeepAlive, KeepAlive: &KeepAliveCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID,
			TxnID: l.TxnID, TTL: g.rng.Int64N(2000)}}
		if g.rng.IntN(4) == 0 {
			c.KeepAlive.Token = g.rng.Int64N(4)
		}
		return c
	case 3, 4:
		l := g.lease()
		c := update(l, fmt.Sprintf(`{"n":%d}`, g.n))
		if g.rng.IntN(3) == 0 {
			v := g.rng.Int64N(3)
			c.Write.IfVersion = &v
		}
		if g.rng.IntN(4) == 0 {
			c.Write.Token = g.rng.Int64N(4)
		}
		return c
	case 5:
		l := g.lease()
		return &Command{Op: OpWrite, Write: &WriteCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID,
			TxnID: l.TxnID, Delete: true}}
	case 6:
		return release(g.lease(), g.rng.IntN(3) == 0)
	case 7:
		req := "r0"
		if len(g.reqs) > 0 {
			req = g.pick(g.reqs)
		}
		return &Command{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: g.pick([]string{"default", "other"}),
			Key: g.pick([]string{"a", "b", "c"}), RequestID: req}}
	default:
		return &Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1 + g.rng.IntN(4), TxnRetention: g.rng.Int64N(3000)}}
	}
}

func (g *gen) learn(r *Result) {
	if r != nil && r.Lease != nil {
		g.leases = append(g.leases, r.Lease)
	}
}
