package rm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// The resource manager's side of transactions coordinated by another
// island: prepare (enlist and lock this island's participants for the
// coordinator) and apply (carry out the coordinator's decision).

// Island names the island this node belongs to.
type Island interface {
	BackendHash() string
}

// Enlisted serves the resource manager endpoints of two-phase
// transactions.
type Enlisted struct {
	store      Store
	island     Island
	clock      Clock
	pendingTTL time.Duration // how long a prepare that names no expiry holds
}

// NewEnlisted wires the resource manager of an island; a prepare that
// names no expiry holds its participants for pendingTTL.
func NewEnlisted(store Store, island Island, clock Clock, pendingTTL time.Duration) *Enlisted {
	return &Enlisted{store: store, island: island, clock: clock, pendingTTL: pendingTTL}
}

// Coordinated is a request of another island's coordinator.
type Coordinated struct {
	TxnID        string
	State        string // commit or rollback for Apply
	Home         string // the coordinating island's backend hash
	Term         uint64 // its coordinator's term
	Target       string // the island the coordinator means; empty: any
	ExpiresAt    time.Time
	Owner        string
	Participants []fsm.Participant
}

// BackendHash validates an island's backend hash: printable, at most 128
// bytes.
func BackendHash(h string) (string, error) {
	h = strings.TrimSpace(h)
	if len(h) > 128 || !printable(h) || strings.ContainsAny(h, " /") {
		return "", errcode.InvalidParams.With("backend_hash %q is malformed", h)
	}
	return h, nil
}

// Participants validates participants and names this island's own with
// its backend hash.
func Participants(ps []fsm.Participant, self string) ([]fsm.Participant, error) {
	if len(ps) > fsm.MaxParticipants {
		return nil, errcode.TxnTooLarge.With("a transaction holds at most %d keys", fsm.MaxParticipants)
	}
	out := make([]fsm.Participant, 0, len(ps))
	for _, p := range ps {
		ns, key, err := participant(p)
		if err != nil {
			return nil, err
		}
		b, err := BackendHash(p.Backend)
		if err != nil {
			return nil, err
		}
		if b == "" {
			b = self
		}
		out = append(out, fsm.Participant{Namespace: ns, Key: key, Backend: b})
	}
	return out, nil
}

// participant validates a participant's name: a key or queue message, or
// a UTXO transaction {.utxo, <txid>}.
func participant(p fsm.Participant) (string, string, error) {
	if p.Namespace == wire.UTXOParticipantNamespace {
		id, err := TxIDHex(p.Key)
		return p.Namespace, id, err
	}
	return Resource(p.Namespace, p.Key)
}

// NotTarget is the answer of island self to a request meant for island
// target: txn_backend_mismatch naming self, so that the caller tries the
// target's next endpoint. A server that does not know its island's hash
// yet (a new member still catching up) cannot tell: it answers 503
// unavailable, to be asked again.
func NotTarget(self, target string) *errcode.Error {
	if self == "" {
		e := errcode.Unavailable.With("this server does not know its island yet; retry")
		e.RetryAfter = 1
		return e
	}
	e := errcode.TxnBackendMismatch.With("this is island %s, not %s", self, target)
	e.Island = self
	return e
}

func (e *Enlisted) check(c Coordinated) (Coordinated, error) {
	var err error
	if c.TxnID, err = TxnID(c.TxnID); err != nil {
		return c, err
	}
	self := e.island.BackendHash()
	if c.Target != "" && c.Target != self {
		return c, NotTarget(self, c.Target)
	}
	if c.Home, err = BackendHash(c.Home); err != nil {
		return c, err
	}
	if c.Participants, err = Participants(c.Participants, self); err != nil {
		return c, err
	}
	mine := c.Participants[:0]
	for _, p := range c.Participants {
		if p.Backend == self {
			mine = append(mine, p)
		}
	}
	c.Participants = mine
	return c, nil
}

// Prepare enlists this island's participants in a transaction coordinated
// by another island and locks them for it until its decision arrives. A
// participant held by another transaction fails the prepare at once with
// txn_lock_conflict (LOCKED:<holder>), without a Raft round unless the
// transaction holds something here already (then it is rolled back here
// first); a repeated prepare that is already in place needs no Raft round
// either. A decided transaction answers with its decision.
func (e *Enlisted) Prepare(ctx context.Context, c Coordinated) (*fsm.TxnInfo, error) {
	c, err := e.check(c)
	if err != nil {
		return nil, err
	}
	if c.Home == "" || c.Term == 0 {
		return nil, errcode.InvalidParams.With("a prepare needs tc_backend_hash and tc_term")
	}
	if c.Home == e.island.BackendHash() {
		return nil, errcode.TxnBackendMismatch.With("island %s coordinates this transaction itself", c.Home)
	}
	if c.ExpiresAt.IsZero() {
		c.ExpiresAt = e.clock.Now().Add(e.pendingTTL)
	}
	var done *fsm.TxnInfo
	var conflict *errcode.Error
	holds := false // the transaction has a record here: it may hold something
	err = e.store.Read(ctx, func(v *fsm.View) error {
		if seen := v.TCTerm(c.Home); c.Term < seen {
			return errcode.TCTermStale.With("term %d of island %s's coordinator is older than %d", c.Term, c.Home, seen)
		}
		t := v.Txn(c.TxnID)
		if t != nil && t.State != fsm.TxnPending {
			done = &fsm.TxnInfo{TxnID: c.TxnID, State: t.State, Reason: t.Reason, Detail: t.Detail, Home: t.Home, TCTerm: t.TCTerm}
			return nil
		}
		holds = t != nil
		for _, p := range c.Participants {
			if holder, ok := v.Conflict(p.Namespace, p.Key, c.TxnID, c.Owner); ok {
				conflict = errcode.TxnLockConflict.With("%s%s", fsm.LockedPrefix, holder)
				return nil
			}
		}
		if t != nil && t.Home == c.Home && t.ExpiresAt >= c.ExpiresAt.UnixMilli() && covers(t.Participants, c.Participants) {
			done = &fsm.TxnInfo{TxnID: c.TxnID, State: t.State, Home: t.Home, TCTerm: t.TCTerm, ExpiresAt: t.ExpiresAt}
		}
		return nil
	})
	if err != nil || done != nil {
		return done, err
	}
	if conflict != nil {
		return nil, e.conflicted(ctx, c, conflict, holds)
	}
	res, err := e.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnPrepare, Prepare: &fsm.PrepareCmd{
		TxnID: c.TxnID, Home: c.Home, Term: c.Term, ExpiresAt: c.ExpiresAt.UnixMilli(), Owner: c.Owner,
		LeaseID: xid.New().String(), Participants: local(c.Participants)}})
	var refused *errcode.Error
	switch {
	case errors.As(err, &refused) && refused.Code == errcode.TxnLockConflict.Code:
		// Another holder took a participant after the look above: the
		// conflict is answered as one found there.
		return nil, e.conflicted(ctx, c, refused, holds)
	case errors.As(err, &refused) && refused.Code == errcode.MalformedCmd.Code && !e.clock.Now().Before(c.ExpiresAt):
		// The expiry was in the future when the request was read, and had
		// passed by the time of the entry.
		return nil, errcode.InvalidTTL.With("expires_at_unix passed before the prepare was recorded")
	}
	if err != nil {
		return nil, err
	}
	return res.Txn, nil
}

// conflicted answers a prepare's lock conflict. The coordinator rolls the
// transaction back for good and counts an island that answered a conflict
// as done. One where the transaction holds something already (a lease it
// took here, a delivery: holds) rolls it back itself before answering, so
// that nothing stays held and nothing commits here later.
func (e *Enlisted) conflicted(ctx context.Context, c Coordinated, conflict *errcode.Error, holds bool) error {
	if holds {
		if _, err := e.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnRMApply, RMApply: &fsm.RMApplyCmd{
			TxnID: c.TxnID, State: fsm.TxnRollback, Home: c.Home, Term: c.Term, Participants: local(c.Participants)}}); err != nil {
			return err
		}
	}
	return conflict
}

// covers reports whether every participant of want is in have (this
// island's own are stored with an empty backend).
func covers(have, want []fsm.Participant) bool {
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h fsm.Participant) bool {
			return h.Backend == "" && h.Namespace == w.Namespace && h.Key == w.Key
		}) {
			return false
		}
	}
	return true
}

func local(ps []fsm.Participant) []fsm.Participant {
	out := make([]fsm.Participant, len(ps))
	for i, p := range ps {
		out[i] = fsm.Participant{Namespace: p.Namespace, Key: p.Key}
	}
	return out
}

// Apply carries out a coordinator's decision on this island's participants
// in one Raft entry. Repeating it changes nothing. A decision from a
// coordinator term older than one already seen is refused (tc_term_stale).
// Without a coordinating island (lockd's local RM apply), the decision must
// already be recorded here: a transaction still pending answers
// txn_pending.
func (e *Enlisted) Apply(ctx context.Context, c Coordinated) (*fsm.TxnInfo, error) {
	c, err := e.check(c)
	if err != nil {
		return nil, err
	}
	if c.State != fsm.TxnCommit && c.State != fsm.TxnRollback {
		return nil, errcode.InvalidParams.With("state must be commit or rollback")
	}
	if c.Home == "" || c.Home == e.island.BackendHash() {
		var info *fsm.TxnInfo
		err := e.store.Read(ctx, func(v *fsm.View) error {
			t := v.Txn(c.TxnID)
			switch {
			case t == nil || t.State == fsm.TxnPending:
				return errcode.TxnPending.With("no decision is recorded for transaction %s", c.TxnID)
			case t.State != c.State:
				return decided(t)
			}
			info = &fsm.TxnInfo{TxnID: c.TxnID, State: t.State, TCTerm: t.TCTerm}
			return nil
		})
		return info, err
	}
	if c.Term == 0 {
		return nil, errcode.InvalidParams.With("a decision of another island needs tc_term")
	}
	// A decision already applied is answered without a Raft round.
	var done *fsm.TxnInfo
	err = e.store.Read(ctx, func(v *fsm.View) error {
		if seen := v.TCTerm(c.Home); c.Term < seen {
			return errcode.TCTermStale.With("term %d of island %s's coordinator is older than %d", c.Term, c.Home, seen)
		}
		t := v.Txn(c.TxnID)
		switch {
		case t == nil:
			// Nothing is held here yet, but the decision is recorded all
			// the same: a prepare that arrives after it (one the
			// coordinator gave up on, still in flight) then answers with
			// the decision instead of locking for a transaction whose
			// coordinator already counted this island as done.
		case t.State == fsm.TxnPending:
		case t.State != c.State:
			return decided(t)
		default:
			done = &fsm.TxnInfo{TxnID: c.TxnID, State: t.State, Home: t.Home, TCTerm: t.TCTerm}
		}
		return nil
	})
	if err != nil || done != nil {
		return done, err
	}
	res, err := e.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnRMApply, RMApply: &fsm.RMApplyCmd{
		TxnID: c.TxnID, State: c.State, Home: c.Home, Term: c.Term, Participants: local(c.Participants)}})
	if err != nil {
		return nil, err
	}
	return res.Txn, nil
}

func decided(t *fsm.TxnRecord) *errcode.Error {
	if t.State == fsm.TxnCommit {
		return errcode.TxnCommitted.With("transaction already committed")
	}
	return errcode.TxnRolledBack.With("transaction already rolled back (%s)", t.Reason)
}
