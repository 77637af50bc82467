package fsm

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/raftlockd/raftlockd/wire"
)

// gen produces random but plausible commands: a few keys, leases learned from
// earlier results (sometimes stale, sometimes forged), all operations.
type gen struct {
	rng        *rand.Rand
	n          int
	leases     []*LeaseInfo
	reqs       []string
	deliveries []*MessageInfo
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
	switch g.rng.IntN(20) {
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
		c.Acquire.Attempt = g.pick([]string{"", "x", "y"})
		c.Acquire.IfNotExists = g.rng.IntN(5) == 0
		c.Acquire.Node, c.Acquire.Run = g.pick([]string{"n1", "n2"}), g.pick([]string{"run1", "run2"})
		if g.rng.IntN(10) == 0 {
			// A server restarted: what waited on it in its other run goes.
			return &Command{Op: OpDropWaits, DropWaits: &DropWaitsCmd{Node: c.Acquire.Node, Run: c.Acquire.Run}}
		}
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
		if g.rng.IntN(4) == 0 {
			// The leader's listing may be stale: any keys are offered.
			c := &ForgetKeysCmd{}
			for i := 1 + g.rng.IntN(3); i > 0; i-- {
				c.Keys = append(c.Keys, KeyName{Namespace: g.pick([]string{"default", "other"}), Key: g.pick([]string{"a", "b", "c"})})
			}
			return &Command{Op: OpForgetKeys, ForgetKeys: c}
		}
		return release(g.lease(), g.rng.IntN(3) == 0)
	case 7:
		req := "r0"
		if len(g.reqs) > 0 {
			req = g.pick(g.reqs)
		}
		return &Command{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: g.pick([]string{"default", "other"}),
			Key: g.pick([]string{"a", "b", "c"}), RequestID: req, Attempt: g.pick([]string{"", "x", "y"})}}
	case 8:
		return g.utxo(id)
	case 9:
		return &Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: g.txn(), State: g.pick([]string{TxnPending, TxnCommit, TxnRollback, "bogus"}),
			Participants: g.participants(), ExpiresAt: g.rng.Int64N(3000), Owner: g.pick([]string{"", "o"}), LeaseID: "l" + id,
			Prepared: g.backends()}}
	case 10:
		return &Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: g.txn(), Home: g.pick([]string{"h1", "h2", ""}),
			Term: g.rng.Uint64N(4), ExpiresAt: g.rng.Int64N(3000), Owner: g.pick([]string{"", "o"}), LeaseID: "l" + id,
			Participants: g.participants()}}
	case 11:
		return &Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: g.txn(), State: g.pick([]string{TxnCommit, TxnRollback, TxnPending}),
			Home: g.pick([]string{"h1", "h2"}), Term: g.rng.Uint64N(4), Participants: g.participants()}}
	case 12:
		return &Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: g.txn(), Backends: g.backends()}}
	case 13:
		return &Command{Op: OpRMRegister, RMRegister: &RMRegisterCmd{Backend: g.pick([]string{"h1", "h2"}),
			Endpoint: g.pick([]string{"http://x", "http://y"}), Remove: g.rng.IntN(3) == 0,
			PassedOn: g.rng.IntN(2) == 0, ChangedAt: g.rng.Int64N(3) * 1000}}
	case 14, 15:
		c := &EnqueueCmd{Namespace: "default", Queue: g.pick([]string{"q", "p"}), ID: "m" + id, Visibility: 200 + g.rng.Int64N(2000),
			MaxAttempts: 1 + g.rng.IntN(3), Delay: g.rng.Int64N(3) * 300, TTL: g.rng.Int64N(2) * 3000, Payload: []byte("p" + id)}
		if g.rng.IntN(4) == 0 {
			c.TxnID = g.txn()
		}
		if g.rng.IntN(3) == 0 {
			// Retries of a few idempotent enqueues.
			c.ID, c.Idempotent = "mi"+strconv.Itoa(g.rng.IntN(4)), true
		}
		return &Command{Op: OpEnqueue, Enqueue: c}
	case 16:
		c := &DequeueCmd{Namespace: "default", Queue: g.pick([]string{"q", "p", "q.dlq"}), Owner: "o", RequestID: "d" + id,
			LeaseID: "ql" + id, Wait: g.rng.Int64N(2) * 1000, Visibility: g.rng.Int64N(2) * 500}
		if g.rng.IntN(4) == 0 {
			c.TxnID = g.txn()
		}
		if g.rng.IntN(3) == 0 {
			c.WithState, c.StateLease, c.StateTxn = true, "sl"+id, "st"+id
		}
		return &Command{Op: OpDequeue, Dequeue: c}
	case 17:
		return &Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: g.delivery()}}
	case 18:
		return &Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: g.delivery(), Defer: g.rng.IntN(2) == 0,
			Delay: g.rng.Int64N(2) * 500}}
	case 19:
		if g.rng.IntN(2) == 0 {
			return &Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "d" + id}}
		}
		return &Command{Op: OpQExtend, QExtend: &QueueExtendCmd{MessageRef: g.delivery(), By: g.rng.Int64N(2000)}}
	default:
		c := &SweepCmd{Limit: 1 + g.rng.IntN(4), TxnRetention: g.rng.Int64N(3000)}
		if g.rng.IntN(40) == 0 {
			c.Format = EntryFormat // the island adopts this build's rules midway
		}
		return &Command{Op: OpSweep, Sweep: c}
	}
}

// delivery picks a delivery learned from earlier results, sometimes stale.
func (g *gen) delivery() MessageRef {
	if len(g.deliveries) == 0 || g.rng.IntN(8) == 0 {
		return MessageRef{Namespace: "default", Queue: "q", ID: "m1", LeaseID: "forged"}
	}
	m := g.deliveries[g.rng.IntN(len(g.deliveries))]
	return MessageRef{Namespace: m.Namespace, Queue: m.Queue, ID: m.ID, LeaseID: m.Lease.ID, Token: m.Lease.Token * int64(g.rng.IntN(2))}
}

// txn picks a transaction id: often one that holds leases.
func (g *gen) txn() string {
	if g.rng.IntN(3) > 0 {
		return g.lease().TxnID
	}
	return fmt.Sprintf("t%d", g.rng.IntN(g.n+1))
}

func (g *gen) backends() []string {
	var out []string
	for _, b := range []string{"h1", "h2"} {
		if g.rng.IntN(2) == 0 {
			out = append(out, b)
		}
	}
	return out
}

// participants mixes keys of this island and of islands h1 and h2.
func (g *gen) participants() []Participant {
	var out []Participant
	for i := g.rng.IntN(4); i > 0; i-- {
		p := Participant{Namespace: g.pick([]string{"default", "other"}), Key: g.pick([]string{"a", "b", "c"}),
			Backend: g.pick([]string{"", "", "h1", "h2"})}
		if g.rng.IntN(4) == 0 {
			p.Namespace, p.Key = wire.UTXOParticipantNamespace, g.pick(genTxIDs)
		}
		out = append(out, p)
	}
	return out
}

func (g *gen) learn(r *Result) {
	if r != nil && r.Lease != nil {
		g.leases = append(g.leases, r.Lease)
	}
	if r != nil && r.Queue != nil && r.Queue.Message != nil && r.Queue.Message.Lease != nil {
		g.deliveries = append(g.deliveries, r.Queue.Message)
		if st := r.Queue.Message.State; st != nil {
			g.leases = append(g.leases, st)
		}
	}
}

// genTxIDs are the UTXO transactions the generator works on; genHashes the
// hashes their outputs and spenders take.
var (
	genTxIDs  = []string{strings.Repeat("a1", 32), strings.Repeat("b2", 32), strings.Repeat("c3", 32)}
	genHashes = []string{strings.Repeat("01", 32), strings.Repeat("02", 32)}
)

// utxo produces a UTXO command: a step of a creation (records of two
// vouts), a spend (sometimes staged), or an update.
func (g *gen) utxo(id string) *Command {
	txid := g.pick(genTxIDs)
	switch g.rng.IntN(5) {
	case 0, 1:
		c := &UTXOCreateCmd{Phase: g.pick([]string{UTXOPhaseLock, UTXOPhaseRecord, UTXOPhaseRecord, UTXOPhaseChildren, UTXOPhaseMaster, UTXOPhaseMaster}),
			TxID: txid, Owner: g.pick([]string{"o1", "o1", "o1", "o2"}), Records: 2, TTL: 500 + g.rng.Int64N(2000)}
		if g.rng.IntN(6) == 0 {
			c.TxnID = g.txn()
		}
		c.Record = g.rng.IntN(2)
		c.First, c.Count = uint32(c.Record*2), 2
		c.Outputs = []UTXOOut{{Vout: c.First, Sats: 1}, {Vout: c.First + 1, Sats: 2}}
		if c.Record == 0 {
			c.Master = &UTXOMaster{Records: 2, Vouts: 4, Total: 4, Coinbase: g.rng.IntN(4) == 0}
		}
		if g.rng.IntN(5) == 0 {
			c.Phase, c.Records, c.Record, c.First, c.TxnID = UTXOPhaseWhole, 1, 0, 0, ""
			c.Outputs = c.Outputs[:1]
			c.Master = &UTXOMaster{Records: 1, Vouts: 2, Total: 1}
		}
		return &Command{Op: OpUTXOCreate, UTXOCreate: c}
	case 2, 3:
		c := &UTXOSpendCmd{IgnoreConflicting: g.rng.IntN(2) == 0, IgnoreLocked: g.rng.IntN(2) == 0}
		for i := 1 + g.rng.IntN(2); i > 0; i-- {
			c.Spends = append(c.Spends, UTXOSpendItem{TxID: g.pick(genTxIDs), Vout: g.rng.Uint32N(5),
				Hash: strings.Repeat("00", 32), Spender: g.pick(genHashes), Vin: g.rng.Uint32N(2)})
		}
		if g.rng.IntN(3) == 0 {
			c.TxnID, c.TTL = g.txn(), 200+g.rng.Int64N(2000)
		}
		return &Command{Op: OpUTXOSpend, UTXOSpend: c}
	}
	c := &UTXOUpdateCmd{Kind: g.pick([]string{UTXOUnspend, UTXOFreeze, UTXOUnfreeze, UTXOReassign, UTXOConflicting,
		UTXOLockedFlag, UTXOPreserve, UTXOMined, UTXOLongestChain, UTXOHeight}),
		TxIDs: []string{txid}, Value: g.rng.IntN(2) == 0, Height: g.rng.Uint32N(300), BlockID: g.rng.Uint32N(3),
		OnLongestChain: g.rng.IntN(2) == 0, Unset: g.rng.IntN(3) == 0, NewHash: strings.Repeat("00", 32),
		Outpoints: []UTXOPoint{{TxID: txid, Vout: g.rng.Uint32N(5), Hash: strings.Repeat("00", 32)}}}
	return &Command{Op: OpUTXOUpdate, UTXOUpdate: c}
}
