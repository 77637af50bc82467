// Package tc is the transaction coordinator. It turns a request to end a
// transaction into a final decision recorded in the reserved .txns
// namespace through Raft, before anything is applied anywhere.
//
// For a transaction whose participants all live on this island, recording
// the decision and applying it to every participant (promoting or
// discarding staged writes, releasing leases, handing keys to queued
// acquirers) is one replicated entry. A transaction that reaches other
// islands is decided by two-phase commit: the coordinator prepares the
// other islands' participants (a participant held by another transaction
// fails the transaction at once), records the decision with the Raft term
// of the entry that holds it, applies it locally in that same entry, and
// fans it out to the other islands with retries. Decisions other islands
// have not applied yet are replayed by the leader (Resolver); a pending
// decision that outlives its expiry is rolled back (presumed abort). A
// decision, once recorded, is never changed.
package tc

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// Store is the island's replicated state as the coordinator uses it.
type Store interface {
	Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error)
	Read(ctx context.Context, fn func(v *fsm.View) error) error
}

// Island is this node's island.
type Island interface {
	BackendHash() string
	// Term is the current Raft term: the fencing token of the
	// coordinator's requests to other islands.
	Term() uint64
	// Endpoints lists the API endpoints of the island's members.
	Endpoints() ([]string, time.Time, error)
	// IsLeader and LeaderEndpoint say whether this node coordinates, and
	// where the node that does is.
	IsLeader() bool
	LeaderEndpoint() string
}

// Remote reaches another island's API.
type Remote interface {
	Prepare(ctx context.Context, endpoint string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error)
	Apply(ctx context.Context, endpoint string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error)
	// Decide asks island home's coordinator (empty: this island's), at
	// endpoint, to decide.
	Decide(ctx context.Context, endpoint, home string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error)
	// Replay asks island home's coordinator, at endpoint, to replay txnID.
	Replay(ctx context.Context, endpoint, home, txnID string) (wire.TxnReplayResponse, error)
	Register(ctx context.Context, endpoint string, req wire.TCRMRegisterRequest, remove bool) (wire.TCRMRegisterResponse, error)
}

// Clock is the leader's clock, the one commands are stamped with.
type Clock interface{ Now() time.Time }

// Config tunes the coordinator.
type Config struct {
	FanoutTimeout    time.Duration // one attempt to reach an island (default 5s)
	FanoutAttempts   int           // attempts per island and request (default 4)
	FanoutBaseDelay  time.Duration // first retry delay (default 50ms)
	FanoutMaxDelay   time.Duration // longest retry delay (default 2s)
	FanoutMultiplier float64       // growth of the retry delay (default 2)
	PendingTTL       time.Duration // expiry of a pending decision that names none (default 30s)
	Peers            []string      // API endpoints of other islands to register with
	Logger           *slog.Logger
}

func (c *Config) defaults() {
	if c.FanoutTimeout <= 0 {
		c.FanoutTimeout = 5 * time.Second
	}
	if c.FanoutAttempts <= 0 {
		c.FanoutAttempts = 4
	}
	if c.FanoutBaseDelay <= 0 {
		c.FanoutBaseDelay = 50 * time.Millisecond
	}
	if c.FanoutMaxDelay <= 0 {
		c.FanoutMaxDelay = 2 * time.Second
	}
	if c.FanoutMultiplier < 1 {
		c.FanoutMultiplier = 2
	}
	if c.PendingTTL <= 0 {
		c.PendingTTL = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Coordinator records and applies transaction decisions.
type Coordinator struct {
	store  Store
	island Island
	remote Remote
	clock  Clock
	cfg    Config

	learned atomic.Bool // the registry gained an island since the last sync

	// fanning holds the transactions whose decision a request is recording
	// and sending to the other islands right now: the resolver, woken by
	// the same decision, leaves them to it instead of sending it twice.
	fanning sync.Map // txn id -> struct{}
}

// New returns a coordinator for the island store replicates.
func New(store Store, island Island, remote Remote, clock Clock, cfg Config) *Coordinator {
	cfg.defaults()
	return &Coordinator{store: store, island: island, remote: remote, clock: clock, cfg: cfg}
}

// Outcome is the decision a release led to.
type Outcome struct {
	Released bool
	Decision string // fsm.TxnCommit or fsm.TxnRollback
}

// Release ends the transaction of the lease in ref: it commits every staged
// write of the transaction (across all its keys, namespaces and islands)
// unless rollback is set, and releases all of the transaction's leases. A
// transaction that spans islands is decided by its coordinator: this one,
// or the coordinating island's.
func (c *Coordinator) Release(ctx context.Context, ref rm.LeaseRef, rollback bool) (Outcome, error) {
	ref, err := ref.Validate(true)
	if err != nil {
		return Outcome{}, err
	}
	res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{
		Namespace: ref.Namespace, Key: ref.Key, LeaseID: ref.LeaseID, TxnID: ref.TxnID, Token: ref.Token, Rollback: rollback}})
	var coordinated *errcode.Error
	if errors.As(err, &coordinated) && coordinated.Code == errcode.TxnCoordinated.Code {
		return c.releaseCoordinated(ctx, ref.TxnID, coordinated.Home, rollback)
	}
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Released: res.Released, Decision: res.Decision}, nil
}

// DecideCoordinated commits (or rolls back) txn through its coordinator:
// this island's when home is empty, home's otherwise. A decision that went
// the other way is an error.
func (c *Coordinator) DecideCoordinated(ctx context.Context, txn, home string, commit bool) error {
	_, err := c.releaseCoordinated(ctx, txn, home, !commit)
	return err
}

func (c *Coordinator) releaseCoordinated(ctx context.Context, txn, home string, rollback bool) (Outcome, error) {
	state := fsm.TxnCommit
	if rollback {
		state = fsm.TxnRollback
	}
	var info *fsm.TxnInfo
	var err error
	switch {
	case home == "" && c.island.IsLeader():
		info, err = c.Decide(ctx, Decision{TxnID: txn, State: state})
	case home == "":
		// This island coordinates it, and its leader decides.
		info, err = c.decideAtLeader(ctx, txn, state)
	default:
		info, err = c.decideAt(ctx, home, txn, state)
	}
	if err != nil {
		return Outcome{}, err
	}
	if info.State != state {
		return Outcome{}, outcomeErr(info)
	}
	return Outcome{Released: true, Decision: info.State}, nil
}

// decideAtLeader asks this island's leader to decide txn.
func (c *Coordinator) decideAtLeader(ctx context.Context, txn, state string) (*fsm.TxnInfo, error) {
	ep := c.island.LeaderEndpoint()
	if ep == "" {
		e := errcode.NoLeader.With("no leader is known to decide transaction %s", txn)
		e.RetryAfter = 1
		return nil, e
	}
	resp, err := c.remote.Decide(ctx, ep, "", wire.TxnDecisionRequest{TxnID: txn, State: state})
	if err != nil {
		return nil, unwrapEnvelope(err)
	}
	return &fsm.TxnInfo{TxnID: txn, State: resp.State, TCTerm: resp.TCTerm}, nil
}

// decideAt asks island home's coordinator to decide txn.
func (c *Coordinator) decideAt(ctx context.Context, home, txn, state string) (*fsm.TxnInfo, error) {
	var resp wire.TxnDecisionResponse
	err := c.atIsland(ctx, home, func(ctx context.Context, ep string) error {
		var err error
		resp, err = c.remote.Decide(ctx, ep, home, wire.TxnDecisionRequest{TxnID: txn, State: state})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &fsm.TxnInfo{TxnID: txn, State: resp.State, Home: home, TCTerm: resp.TCTerm}, nil
}

// Decision is a request to the coordinator.
type Decision struct {
	TxnID        string
	State        string            // pending, commit or rollback
	Participants []fsm.Participant // an empty Backend means this island
	ExpiresAt    time.Time         // pending: presumed aborted after this; zero: PendingTTL from now
	Owner        string            // holds the keys a prepare locks; its own keys are no conflict
	settled      []string          // islands that refused the prepare for good and hold nothing
}

func (c *Coordinator) check(d Decision) (Decision, error) {
	var err error
	if d.TxnID, err = rm.TxnID(d.TxnID); err != nil {
		return d, err
	}
	if d.State != fsm.TxnPending && d.State != fsm.TxnCommit && d.State != fsm.TxnRollback {
		return d, errcode.InvalidParams.With("state must be pending, commit or rollback")
	}
	if d.Participants, err = rm.Participants(d.Participants, c.island.BackendHash()); err != nil {
		return d, err
	}
	if len(d.Owner) > 256 {
		return d, errcode.InvalidParams.With("owner is longer than 256 bytes")
	}
	if d.ExpiresAt.IsZero() {
		d.ExpiresAt = c.clock.Now().Add(c.cfg.PendingTTL)
	}
	return d, nil
}

// Decide records a decision on a transaction coordinated by this island.
// Pending enlists the participants: this island's are locked, the other
// islands' are prepared, and a participant held by another transaction
// rolls the transaction back for good (txn_lock_conflict, LOCKED:<holder>;
// a retry answers the same at once). Commit prepares the other islands'
// participants if needed, records the decision, applies it here in the
// same entry and then on every other island; rollback likewise. A decision
// already recorded is answered as it is, once the islands that had not
// applied it were sent it again.
func (c *Coordinator) Decide(ctx context.Context, d Decision) (*fsm.TxnInfo, error) {
	d, err := c.check(d)
	if err != nil {
		return nil, err
	}
	// One read gives the record and whether every island named is known.
	var rec *fsm.TxnRecord
	var unknown error
	var merges bool
	err = c.store.Read(ctx, func(v *fsm.View) error {
		rec, unknown = txnRecord(v, d.TxnID), c.unknownIsland(v, d.Participants)
		merges = v.DecideAddsIslands()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Home != "" {
		e := errcode.TxnNotHome.With("transaction %s is coordinated by island %s", d.TxnID, rec.Home)
		e.Home = rec.Home
		return nil, e
	}
	if rec != nil && rec.State != fsm.TxnPending {
		if rec.State != d.State {
			return c.answer(rec, d.State)
		}
		info := recordInfo(rec)
		if merges && addsIslands(rec, d.Participants, c.island.BackendHash()) {
			// The request names other islands' keys the record does
			// not: they are merged into it and told the decision
			// (before the island follows format 7 such a decide changes
			// nothing, and nothing is proposed).
			if unknown != nil {
				return nil, unknown
			}
			if info, err = c.propose(ctx, &fsm.DecideCmd{TxnID: d.TxnID, State: d.State, Participants: d.Participants}); err != nil {
				return nil, err
			}
		}
		if len(unacked(info)) > 0 {
			// A retry after txn_fanout_failed sends the decision again
			// to the islands still missing it, and says whether they
			// have it now.
			if info, err = c.fanoutAgain(ctx, info); err != nil {
				return info, err
			}
		}
		return info, mixed(info)
	}
	if unknown != nil {
		return nil, unknown
	}
	if rec != nil {
		// What the request names again is counted once.
		d.Participants = fsm.UniqueParticipants(append(d.Participants, withBackend(rec.Participants, c.island.BackendHash())...))
		if len(d.Participants) > fsm.MaxParticipants {
			return nil, errcode.TxnTooLarge.With("a transaction holds at most %d keys", fsm.MaxParticipants)
		}
	}
	switch d.State {
	case fsm.TxnPending:
		return c.prepare(ctx, d)
	case fsm.TxnCommit:
		return c.commit(ctx, d, rec)
	}
	return c.finish(ctx, d, fsm.ReasonTC, "")
}

// fanoutAgain sends a recorded decision to the islands that have not
// applied it, as the request that recorded it did.
func (c *Coordinator) fanoutAgain(ctx context.Context, info *fsm.TxnInfo) (*fsm.TxnInfo, error) {
	c.fanning.Store(info.TxnID, struct{}{})
	defer c.fanning.Delete(info.TxnID)
	return info, c.fanout(ctx, info)
}

// addsIslands reports whether ps names a participant of another island that
// the decided record rec does not hold.
func addsIslands(rec *fsm.TxnRecord, ps []fsm.Participant, self string) bool {
	for _, p := range ps {
		if p.Backend != self && !slices.Contains(rec.Participants, p) {
			return true
		}
	}
	return false
}

// unacked returns the islands other than this one that have not applied the
// decision info describes.
func unacked(info *fsm.TxnInfo) []string {
	rec := fsm.TxnRecord{Participants: info.Participants, Acked: info.Acked}
	return rec.Unacked()
}

// unknownIsland refuses participants on an island that no RM is registered
// for, before anything is recorded: such a participant could never be
// prepared or told the decision.
func (c *Coordinator) unknownIsland(v *fsm.View, ps []fsm.Participant) error {
	self := c.island.BackendHash()
	var rms map[string]fsm.RMEntry
	for _, p := range ps {
		if p.Backend == self {
			continue
		}
		if rms == nil {
			rms = v.RMs()
		}
		if _, ok := rms[p.Backend]; !ok {
			return errcode.TxnBackendUnknown.With("no RM is registered for island %s (raftlockd tc rm register)", p.Backend)
		}
	}
	return nil
}

// answer reports a recorded final decision to a request for want.
func (c *Coordinator) answer(rec *fsm.TxnRecord, want string) (*fsm.TxnInfo, error) {
	info := recordInfo(rec)
	if rec.State == want {
		return info, mixed(info)
	}
	return nil, outcomeErr(info)
}

// outcomeErr explains a decision that is not the one asked for.
func outcomeErr(info *fsm.TxnInfo) error {
	switch {
	case info.Reason == fsm.ReasonLockConflict:
		return errcode.TxnLockConflict.With("%s", info.Detail)
	case info.State == fsm.TxnCommit:
		return errcode.TxnCommitted.With("transaction %s is committed", info.TxnID)
	case info.State == fsm.TxnPending:
		return errcode.TxnPending.With("transaction %s is not decided", info.TxnID)
	}
	if info.Detail != "" {
		return errcode.TxnRolledBack.With("transaction %s was rolled back (%s: %s)", info.TxnID, info.Reason, info.Detail)
	}
	return errcode.TxnRolledBack.With("transaction %s was rolled back (%s)", info.TxnID, info.Reason)
}

func recordInfo(t *fsm.TxnRecord) *fsm.TxnInfo {
	return &fsm.TxnInfo{TxnID: t.ID, State: t.State, Reason: t.Reason, Detail: t.Detail, Home: t.Home, TCTerm: t.TCTerm,
		ExpiresAt: t.ExpiresAt, Participants: t.Participants, Prepared: t.Prepared, Acked: t.Acked, Refused: t.Refused}
}

func withBackend(ps []fsm.Participant, self string) []fsm.Participant {
	out := make([]fsm.Participant, len(ps))
	for i, p := range ps {
		if p.Backend == "" {
			p.Backend = self
		}
		out[i] = p
	}
	return out
}

// record reads txn's record (linearizably), nil when there is none.
func (c *Coordinator) record(ctx context.Context, txn string) (*fsm.TxnRecord, error) {
	var rec *fsm.TxnRecord
	err := c.store.Read(ctx, func(v *fsm.View) error {
		rec = txnRecord(v, txn)
		return nil
	})
	return rec, err
}

// txnRecord returns txn's record with its id, nil when there is none.
func txnRecord(v *fsm.View, txn string) *fsm.TxnRecord {
	t := v.Txn(txn)
	if t != nil {
		t.ID = txn
	}
	return t
}

func (c *Coordinator) propose(ctx context.Context, cmd *fsm.DecideCmd) (*fsm.TxnInfo, error) {
	res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnDecide, Decide: cmd})
	if err != nil {
		return nil, err
	}
	return res.Txn, nil
}

// localConflict checks this island's participants without a Raft round.
func (c *Coordinator) localConflict(ctx context.Context, d Decision) (*errcode.Error, error) {
	self := c.island.BackendHash()
	var conflict *errcode.Error
	err := c.store.Read(ctx, func(v *fsm.View) error {
		for _, p := range d.Participants {
			if p.Backend != self {
				continue
			}
			if holder, ok := v.Conflict(p.Namespace, p.Key, d.TxnID, d.Owner); ok {
				conflict = errcode.TxnLockConflict.With("%s%s", fsm.LockedPrefix, holder)
				return nil
			}
		}
		return nil
	})
	return conflict, err
}

// prepare records a pending decision and prepares every other island.
func (c *Coordinator) prepare(ctx context.Context, d Decision) (*fsm.TxnInfo, error) {
	conflict, err := c.localConflict(ctx, d)
	if err != nil {
		return nil, err
	}
	if conflict != nil {
		return c.abort(ctx, d, fsm.ReasonLockConflict, conflict.Detail)
	}
	info, err := c.propose(ctx, &fsm.DecideCmd{TxnID: d.TxnID, State: fsm.TxnPending, Participants: d.Participants,
		ExpiresAt: d.ExpiresAt.UnixMilli(), Owner: d.Owner, LeaseID: xid.New().String()})
	if c.expired(err, d.ExpiresAt) {
		// The expiry was in the future when the request was checked, and
		// had passed by the time of the entry.
		return nil, errcode.InvalidTTL.With("expires_at_unix passed before the pending decision was recorded")
	}
	if err != nil {
		return nil, err
	}
	if info.State != fsm.TxnPending {
		c.fanoutQuietly(ctx, info)
		return nil, outcomeErr(info)
	}
	if err := c.prepareRemotes(ctx, d, nil); err != nil {
		return c.prepareFailed(ctx, d, err, info.Prepared)
	}
	// Remember who prepared, so that a commit does not need them again.
	remotes := remoteBackends(d.Participants, c.island.BackendHash())
	if len(remotes) == 0 {
		return info, nil
	}
	done, err := c.propose(ctx, &fsm.DecideCmd{TxnID: d.TxnID, State: fsm.TxnPending, Prepared: remotes})
	if c.expired(err, time.UnixMilli(info.ExpiresAt)) {
		// The pending decision expired while the other islands prepared:
		// it is presumed aborted, as the sweeper would have it, and the
		// islands that prepared are told so.
		return c.abort(ctx, d, fsm.ReasonPresumedAbort, "the pending decision expired")
	}
	return done, err
}

// expired reports whether err is the state machine's refusal of a pending
// decision whose expiry, at, has passed (by the leader's clock, which
// stamps the entries).
func (c *Coordinator) expired(err error, at time.Time) bool {
	e := envelope(err)
	return e != nil && e.Code == errcode.MalformedCmd.Code && !c.clock.Now().Before(at)
}

// commit prepares what is not prepared yet, records the commit and fans it
// out.
func (c *Coordinator) commit(ctx context.Context, d Decision, rec *fsm.TxnRecord) (*fsm.TxnInfo, error) {
	// A transaction with a record here (its leases, a pending decision)
	// may name participants it never locked; those it enlisted were
	// checked then (a prepare may have re-entered its owner's keys, and a
	// commit by release names no owner).
	self := c.island.BackendHash()
	check := d
	if rec != nil {
		check.Participants = slices.DeleteFunc(slices.Clone(d.Participants), func(p fsm.Participant) bool {
			return p.Backend == self && slices.Contains(rec.Participants, fsm.Participant{Namespace: p.Namespace, Key: p.Key})
		})
	}
	conflict, err := c.localConflict(ctx, check)
	if err != nil {
		return nil, err
	}
	if conflict != nil {
		return c.abort(ctx, d, fsm.ReasonLockConflict, conflict.Detail)
	}
	// An island that prepared is asked again when the commit names
	// participants there that its prepare did not.
	var prepared []string
	if rec != nil {
		for _, b := range rec.Prepared {
			if !slices.ContainsFunc(d.Participants, func(p fsm.Participant) bool {
				return p.Backend == b && !slices.Contains(rec.Participants, p)
			}) {
				prepared = append(prepared, b)
			}
		}
	}
	if err := c.prepareRemotes(ctx, d, prepared); err != nil {
		var before []string // each still holds what it prepared then
		if rec != nil {
			before = rec.Prepared
		}
		return c.prepareFailed(ctx, d, err, before)
	}
	return c.finish(ctx, d, fsm.ReasonTC, "")
}

// prepareFailed decides what a failed prepare means: a lock conflict or a
// refusal rolls the transaction back for good; an island that did not
// answer leaves it pending for a retry (or its expiry). An island that had
// prepared before (prepared: a renewed pending decision) still holds what
// it prepared then, whatever it answered now, and is told the rollback.
func (c *Coordinator) prepareFailed(ctx context.Context, d Decision, err error, prepared []string) (*fsm.TxnInfo, error) {
	e := envelope(err)
	var r *refusal
	if errors.As(err, &r) {
		for _, b := range r.settled {
			if !slices.Contains(prepared, b) {
				d.settled = append(d.settled, b)
			}
		}
	}
	switch {
	case e != nil && e.Code == errcode.TxnLockConflict.Code:
		return c.abort(ctx, d, fsm.ReasonLockConflict, e.Detail)
	case e != nil && e.Code == errcode.TxnRolledBack.Code:
		return c.abort(ctx, d, fsm.ReasonTC, e.Detail)
	}
	return nil, err
}

// abort rolls the transaction back for reason and answers with it.
func (c *Coordinator) abort(ctx context.Context, d Decision, reason, detail string) (*fsm.TxnInfo, error) {
	d.State = fsm.TxnRollback
	info, err := c.finish(ctx, d, reason, detail)
	if err != nil && !errors.Is(err, errcode.TxnFanoutFailed) {
		return nil, err
	}
	return nil, outcomeErr(info)
}

// finish records a final decision (commit or rollback) and fans it out.
// The resolver leaves the transaction alone meanwhile; what this request
// leaves undone it replays in its next round.
func (c *Coordinator) finish(ctx context.Context, d Decision, reason, detail string) (*fsm.TxnInfo, error) {
	c.fanning.Store(d.TxnID, struct{}{})
	defer c.fanning.Delete(d.TxnID)
	info, err := c.propose(ctx, &fsm.DecideCmd{TxnID: d.TxnID, State: d.State, Participants: d.Participants,
		Prepared: remoteBackends(d.Participants, c.island.BackendHash()), Reason: reason, Detail: detail})
	if err != nil {
		return nil, err
	}
	err = c.fanout(ctx, info, d.settled...)
	if info.State != d.State && d.State != fsm.TxnRollback {
		// A commit recorded as a rollback (a lease of the transaction
		// expired) answers the rollback, as a repeat of the request does,
		// whether or not every island has it yet: txn_fanout_failed would
		// say the commit was recorded. The resolver sends it to the islands
		// still missing it.
		return info, outcomeErr(info)
	}
	if err == nil {
		err = mixed(info)
	}
	return info, err
}

func remoteBackends(ps []fsm.Participant, self string) []string {
	var out []string
	for _, p := range ps {
		if p.Backend != self && p.Backend != "" {
			out = appendNew(out, p.Backend)
		}
	}
	return out
}

func appendNew(set []string, s string) []string {
	for _, x := range set {
		if x == s {
			return set
		}
	}
	return append(set, s)
}

// Replay applies the recorded decision of txn again wherever it has not
// been applied. A pending decision past its expiry is rolled back, one not
// yet expired stays pending, and a transaction this coordinator has no
// record of is rolled back and recorded so (presumed abort). On an island
// that is a resource manager for txn, a replay asks the coordinating island
// for its decision and applies it here (pending while it has none).
//
// The answer carries this coordinator's current term, so that an island
// in doubt can apply it even after it has seen newer terms. An island the
// decision cannot reach now does not fail the replay: the resolver goes on
// trying, and the caller learns the decision.
func (c *Coordinator) Replay(ctx context.Context, txn string) (*fsm.TxnInfo, error) {
	info, err := c.replay(ctx, txn)
	if info != nil && info.Home == "" {
		out := *info
		out.TCTerm = max(out.TCTerm, c.island.Term())
		info = &out
	}
	return info, err
}

func (c *Coordinator) replay(ctx context.Context, txn string) (*fsm.TxnInfo, error) {
	txn, err := rm.TxnID(txn)
	if err != nil {
		return nil, err
	}
	rec, err := c.record(ctx, txn)
	if err != nil {
		return nil, err
	}
	switch {
	case rec == nil:
		return c.propose(ctx, &fsm.DecideCmd{TxnID: txn, State: fsm.TxnRollback, Reason: fsm.ReasonPresumedAbort,
			Detail: "the coordinator has no record of the transaction"})
	case rec.Home != "" && rec.State == fsm.TxnPending:
		info, err := c.resolveDoubt(ctx, rec)
		if errors.Is(err, errcode.TxnPending) {
			// The coordinator has not decided: pending, as it answers.
			return recordInfo(rec), nil
		}
		return info, err
	case rec.Home != "":
		return recordInfo(rec), nil
	case rec.State == fsm.TxnPending && rec.ExpiresAt != 0 && rec.ExpiresAt <= c.clock.Now().UnixMilli():
		// (Without a pending decision, expiry 0, the transaction lives as
		// long as its leases here, whose expiry rolls it back.)
		d := Decision{TxnID: txn, State: fsm.TxnRollback, Participants: withBackend(rec.Participants, c.island.BackendHash())}
		info, err := c.finish(ctx, d, fsm.ReasonPresumedAbort, "the pending decision expired")
		if errors.Is(err, errcode.TxnFanoutFailed) || errors.Is(err, errcode.TxnOutcomeMixed) {
			// The decision is recorded: a replay answers it, as its
			// repeats do (the resolver replays what is missing).
			return info, nil
		}
		return info, err
	case rec.State == fsm.TxnPending:
		return recordInfo(rec), nil
	}
	info := recordInfo(rec)
	c.fanoutQuietly(ctx, info)
	return info, nil
}

// Status returns the record of txn on this island.
func (c *Coordinator) Status(ctx context.Context, txn string) (*fsm.TxnInfo, error) {
	txn, err := rm.TxnID(txn)
	if err != nil {
		return nil, err
	}
	rec, err := c.record(ctx, txn)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, errcode.NotFound.With("no record of transaction %s", txn)
	}
	return recordInfo(rec), nil
}

// resolveDoubt asks the coordinating island of a prepared transaction for
// its decision and applies it here.
func (c *Coordinator) resolveDoubt(ctx context.Context, rec *fsm.TxnRecord) (*fsm.TxnInfo, error) {
	var resp wire.TxnReplayResponse
	err := c.atIsland(ctx, rec.Home, func(ctx context.Context, ep string) error {
		var err error
		resp, err = c.remote.Replay(ctx, ep, rec.Home, rec.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.State != fsm.TxnCommit && resp.State != fsm.TxnRollback {
		return nil, errcode.TxnPending.With("island %s has not decided transaction %s", rec.Home, rec.ID)
	}
	term := max(resp.TCTerm, rec.TCTerm)
	res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnRMApply, RMApply: &fsm.RMApplyCmd{
		TxnID: rec.ID, State: resp.State, Home: rec.Home, Term: term}})
	if err != nil {
		return nil, err
	}
	return res.Txn, nil
}
