// Package tc is the transaction coordinator: it turns a request to end a
// transaction into a final decision recorded in the reserved .txns namespace
// through Raft. For transactions whose participants all live in this
// cluster, recording the decision and applying it to every participant
// (promoting or discarding staged writes, releasing leases, handing keys to
// queued acquirers) is one replicated entry, so no participant can observe a
// half-finished outcome. A decision, once recorded, is never changed: a
// retried release is answered from the record.
package tc

import (
	"context"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
)

// Proposer replicates a command and returns its result.
type Proposer interface {
	Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error)
}

// Coordinator records and applies transaction decisions.
type Coordinator struct {
	proposer Proposer
}

// New returns a coordinator that replicates through p.
func New(p Proposer) *Coordinator { return &Coordinator{proposer: p} }

// Outcome is the decision a release led to.
type Outcome struct {
	Released bool
	Decision string // fsm.TxnCommit or fsm.TxnRollback
}

// Release ends the transaction of the lease in ref: it commits every staged
// write of the transaction (across all its keys and namespaces) unless
// rollback is set, and releases all of the transaction's leases.
func (c *Coordinator) Release(ctx context.Context, ref rm.LeaseRef, rollback bool) (Outcome, error) {
	ref, err := ref.Validate(true)
	if err != nil {
		return Outcome{}, err
	}
	res, err := c.proposer.Propose(ctx, &fsm.Command{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{
		Namespace: ref.Namespace, Key: ref.Key, LeaseID: ref.LeaseID, TxnID: ref.TxnID, Token: ref.Token, Rollback: rollback}})
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Released: res.Released, Decision: res.Decision}, nil
}
