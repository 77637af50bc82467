package fsm

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// Two-phase transactions across islands. An island is one Raft cluster,
// named by its backend hash. The island where a transaction is decided is
// its home: its transaction coordinator (TC) records pending, commit or
// rollback in .txns with the Raft term of the entry that recorded it, and
// applies the decision to its own participants in that same entry. Every
// other island holding participants is a resource manager (RM) for the
// transaction: it prepares (locks and enlists) its participants for the
// home TC and later applies the TC's decision, one entry per decision.
//
// Participants carry the backend hash of their island; this island's own
// participants are stored with an empty backend.

// Why a transaction was decided (besides ReasonRelease and ReasonExpired).
const (
	ReasonTC            = "tc"             // a coordinator's decide request
	ReasonLockConflict  = "lock_conflict"  // a participant was held by another transaction
	ReasonPresumedAbort = "presumed_abort" // pending past its expiry, or unknown to its TC
)

// Buckets of the two-phase protocol.
var (
	bucketTxnExp    = []byte("txn_exp")     // expires_at|txn -> nil: this TC's pending decisions
	bucketTxnFanout = []byte("txn_fanout")  // decided_at|txn -> nil: decisions other islands have not all applied
	bucketTxnDoubt  = []byte("txn_doubt")   // doubt_at|txn -> nil: prepared participants awaiting their TC
	bucketTxnStaged = []byte("txn_staged")  // staged_until|txn -> nil: transactions holding staged enqueues
	bucketTCTerms   = []byte("tc_terms")    // home backend hash -> highest TC term seen (8 bytes)
	bucketRMs       = []byte("rm_registry") // backend hash -> RMEntry
)

// RMEntry is the registry's record of one island: the API endpoints that
// reach its RM, when each was registered, and when endpoints that were
// removed were removed. The registry is last-writer-wins per endpoint
// (RMEntry.Apply), so that a change older than what is recorded, such as an
// island that missed a removal introducing the endpoint again, changes
// nothing. An entry whose endpoints were all removed keeps its removal
// records but is not listed (View.RMs).
type RMEntry struct {
	Endpoints []string `json:"endpoints"`
	UpdatedAt int64    `json:"updated_at"` // when Endpoints last changed here (Unix ms)
	// Added says when each endpoint was registered (Unix ms, the time of
	// the original change, on whichever island it was made); an endpoint
	// missing here was registered before times were recorded: at 0.
	Added map[string]int64 `json:"added,omitempty"`
	// Removed says when each removed endpoint was removed, for
	// RMRemovalRetention after that.
	Removed map[string]int64 `json:"removed,omitempty"`
}

// RMRemovalRetention is how long the registry remembers a removed
// endpoint. An island that missed the removal and comes back later than
// that may introduce the endpoint again, and the others take it back.
const RMRemovalRetention = 7 * 24 * time.Hour

// ChangedAt returns when endpoint was last registered or removed, and
// whether it was removed; known is false when e records neither.
func (e RMEntry) ChangedAt(endpoint string) (at int64, removed, known bool) {
	if at, ok := e.Removed[endpoint]; ok {
		return at, true, true
	}
	if slices.Contains(e.Endpoints, endpoint) {
		return e.Added[endpoint], false, true
	}
	return 0, false, false
}

// Apply returns e after the registration (or removal) c, recorded at now by
// this island's replicated clock, and whether it changes the entry. The
// rule, the same on every island, is last writer wins per endpoint:
//   - a change made on this island (not PassedOn) that the entry does not
//     show yet takes effect at now, or just after what the entry records
//     for the endpoint if another island's clock stamped that later, so
//     that it always wins here; one the entry shows already changes
//     nothing (its recorded time stays);
//   - a change PassedOn from another island takes effect only when it was
//     made (ChangedAt) after what the entry records for the endpoint, a
//     removal winning a tie, and a removal that is older than the
//     retention only removes an endpoint registered before it;
//   - removal records older than RMRemovalRetention are dropped whenever
//     the entry changes.
//
// Accepting a change makes the same change unacceptable, so passing it on
// ends. UpdatedAt moves to now when the endpoints change.
func (e RMEntry) Apply(c RMRegisterCmd, now int64) (RMEntry, bool) {
	at, removed, known := e.ChangedAt(c.Endpoint)
	when := c.ChangedAt
	switch {
	case !c.PassedOn && known && removed == c.Remove:
		return e, false
	case !c.PassedOn:
		when = max(now, at+1)
	case known && (when < at || when == at && (removed || !c.Remove)):
		return e, false
	case !known && c.Remove && when < removalHorizon(now):
		return e, false
	}
	next := RMEntry{Endpoints: slices.Clone(e.Endpoints), UpdatedAt: e.UpdatedAt,
		Added: maps.Clone(e.Added), Removed: maps.Clone(e.Removed)}
	if c.Remove {
		next.Endpoints = slices.DeleteFunc(next.Endpoints, func(x string) bool { return x == c.Endpoint })
		delete(next.Added, c.Endpoint)
		next.Removed = setTime(next.Removed, c.Endpoint, when)
	} else {
		next.Endpoints = mergeSet(next.Endpoints, c.Endpoint)
		delete(next.Removed, c.Endpoint)
		next.Added = setTime(next.Added, c.Endpoint, when)
	}
	maps.DeleteFunc(next.Removed, func(_ string, t int64) bool { return t < removalHorizon(now) })
	if len(next.Endpoints) != len(e.Endpoints) {
		next.UpdatedAt = now
	}
	return next, true
}

// removalHorizon is the time before which removal records are dropped.
func removalHorizon(now int64) int64 { return now - RMRemovalRetention.Milliseconds() }

func setTime(m map[string]int64, k string, t int64) map[string]int64 {
	if m == nil {
		m = map[string]int64{}
	}
	m[k] = t
	return m
}

// DecideCmd records this island's TC decision on a transaction. State is
// pending (enlist participants and lock the local ones until ExpiresAt),
// commit or rollback (final, applied to the local participants in the same
// entry).
type DecideCmd struct {
	TxnID        string        `json:"txn"`
	State        string        `json:"state"`
	Participants []Participant `json:"participants,omitempty"`
	ExpiresAt    int64         `json:"expires_at,omitempty"` // pending: rolled back after this
	Prepared     []string      `json:"prepared,omitempty"`   // remote islands that accepted the prepare
	Owner        string        `json:"owner,omitempty"`      // holder of local keys a pending decision locks
	LeaseID      string        `json:"lease,omitempty"`      // lease id of those locks, minted by the proposer
	Reason       string        `json:"reason,omitempty"`
	Detail       string        `json:"detail,omitempty"`
}

// PrepareCmd enlists this island's participants in a transaction whose TC
// is on the island Home: each is locked for the transaction (or already
// held by it) and stays locked until the TC's decision arrives, whatever
// its lease's expiry.
type PrepareCmd struct {
	TxnID        string        `json:"txn"`
	Home         string        `json:"home"`
	Term         uint64        `json:"term"`
	ExpiresAt    int64         `json:"expires_at"`
	Owner        string        `json:"owner,omitempty"`
	LeaseID      string        `json:"lease"`
	Participants []Participant `json:"participants"`
}

// RMApplyCmd applies the decision of the TC on island Home, sent with that
// TC's current term, to this island's participants.
type RMApplyCmd struct {
	TxnID        string        `json:"txn"`
	State        string        `json:"state"`
	Home         string        `json:"home"`
	Term         uint64        `json:"term"`
	Participants []Participant `json:"participants,omitempty"`
}

// AckCmd notes the islands that applied this TC's decision, or (Refused,
// among Backends) had decided the transaction the other way themselves, so
// that nothing can change what they hold for it.
type AckCmd struct {
	TxnID    string   `json:"txn"`
	Backends []string `json:"backends"`
	Refused  []string `json:"refused,omitempty"`
}

// RMRegisterCmd adds (or with Remove drops) an RM endpoint of an island.
// A change made on this island (an operator's, or the island's own
// membership) takes the command's time; one PassedOn by another island
// keeps the time it was originally made, ChangedAt (0 when the island that
// passed it on did not say: older than anything recorded). RMEntry.Apply
// says which changes take effect.
type RMRegisterCmd struct {
	Backend   string `json:"backend"`
	Endpoint  string `json:"endpoint"`
	Remove    bool   `json:"remove,omitempty"`
	PassedOn  bool   `json:"passed_on,omitempty"`
	ChangedAt int64  `json:"changed_at,omitempty"` // Unix ms
}

// TxnInfo describes a transaction record in a result.
type TxnInfo struct {
	TxnID        string        `json:"txn"`
	State        string        `json:"state"`
	Reason       string        `json:"reason,omitempty"`
	Detail       string        `json:"detail,omitempty"`
	Home         string        `json:"home,omitempty"`
	TCTerm       uint64        `json:"tc_term,omitempty"`
	ExpiresAt    int64         `json:"expires_at,omitempty"`
	Participants []Participant `json:"participants,omitempty"`
	Prepared     []string      `json:"prepared,omitempty"`
	Acked        []string      `json:"acked,omitempty"`
	Refused      []string      `json:"refused,omitempty"`
}

func txnInfo(id string, t *TxnRecord) *TxnInfo {
	return &TxnInfo{TxnID: id, State: t.State, Reason: t.Reason, Detail: t.Detail, Home: t.Home, TCTerm: t.TCTerm,
		ExpiresAt: t.ExpiresAt, Participants: slices.Clone(t.Participants), Prepared: slices.Clone(t.Prepared),
		Acked: slices.Clone(t.Acked), Refused: slices.Clone(t.Refused)}
}

// Remotes returns the islands other than this one that hold participants,
// sorted.
func (t *TxnRecord) Remotes() []string {
	var out []string
	for _, p := range t.Participants {
		if p.Backend != "" && !slices.Contains(out, p.Backend) {
			out = append(out, p.Backend)
		}
	}
	slices.Sort(out)
	return out
}

// Unacked returns the remote islands that have not applied the decision.
func (t *TxnRecord) Unacked() []string {
	var out []string
	for _, b := range t.Remotes() {
		if !slices.Contains(t.Acked, b) {
			out = append(out, b)
		}
	}
	return out
}

// TxnClockSkew is how far the clock of the server that minted a
// transaction id may be ahead of an island's, or behind it, for the island
// to tell a transaction it forgot from one it never knew (forgotten).
const TxnClockSkew = time.Minute

// forgot notes that the island forgot, or may have forgotten, the record of
// a transaction created at createdAt (Unix ms).
func (s *applyState) forgot(createdAt int64) {
	if createdAt > int64(u64(s.b(bucketMeta).Get(metaTxnForgot))) {
		s.put(bucketMeta, metaTxnForgot, putU64(uint64(createdAt)))
	}
}

// forgotten reports whether a request would enlist this island's
// participants among ps in transaction txn, of which the island has no
// record (t is nil) and which it may have forgotten, under rules of format
// 13 or later. A transaction id is an xid, which carries the second it was
// minted: the island may have forgotten a transaction minted no later
// than TxnClockSkew after the creation of the latest record it forgot
// (metaTxnForgot), and one minted more than TxnClockSkew ahead of its
// clock cannot be placed. Such a transaction may have held the
// participants here and been rolled back, its staged writes discarded;
// locking them for it now would let its other islands commit alone. An id
// that is not an xid says nothing.
func (s *applyState) forgotten(txn string, t *TxnRecord, ps []Participant) bool {
	if t != nil || s.rules() < formatV13 {
		return false
	}
	local := false
	locals(ps, func(Participant) bool { local = true; return false })
	if !local {
		return false
	}
	id, err := xid.FromString(txn)
	if err != nil {
		return false
	}
	minted, skew := id.Time().UnixMilli(), TxnClockSkew.Milliseconds()
	return minted <= int64(u64(s.b(bucketMeta).Get(metaTxnForgot)))+skew || minted > s.now+skew
}

// forgottenDetail explains the rollback of a transaction the island may
// have forgotten.
const forgottenDetail = "the island has no record of the transaction and may have rolled it back and forgotten it"

// LockedPrefix starts the detail of a lock conflict: LOCKED:<holder>.
const LockedPrefix = "LOCKED:"

func lockConflict(owner string) *errcode.Error {
	return errcode.TxnLockConflict.With("%s%s", LockedPrefix, owner)
}

// Conflict reports the owner holding the participant (ns, key) for a
// transaction other than txn, unless that owner is owner itself (a holder
// re-entering its own key is not a conflict): a key's lease, a message's
// delivery or staging, a UTXO transaction's staged creation, as a prepare
// applied would find it.
func (r reader) Conflict(ns, key, txn, owner string) (holder string, conflict bool) {
	return (&applyState{reader: r}).resource(Participant{Namespace: ns, Key: key}).holder(txn, owner)
}

func validState(s string, pendingOK bool) bool {
	return s == TxnCommit || s == TxnRollback || (pendingOK && s == TxnPending)
}

func validTxnID(id string) bool { return id != "" && len(id) <= 128 && !hasNUL(id) }

// localize checks participants and keeps this island's own with an empty
// backend, sorted and without duplicates.
func (s *applyState) localize(ps []Participant) ([]Participant, *errcode.Error) {
	self := s.selfBackend()
	out := make([]Participant, 0, len(ps))
	for _, p := range ps {
		if err := validName(p.Namespace, p.Key); err != nil {
			return nil, err
		}
		if hasNUL(p.Backend) || len(p.Backend) > 128 {
			return nil, errcode.MalformedCmd.With("bad backend hash")
		}
		if p.Backend == self {
			p.Backend = ""
		}
		out = append(out, p)
	}
	return sortParticipants(out), nil
}

func sortParticipants(ps []Participant) []Participant {
	slices.SortFunc(ps, func(a, b Participant) int {
		if c := strings.Compare(a.Backend, b.Backend); c != 0 {
			return c
		}
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return slices.Compact(ps)
}

func (s *applyState) selfBackend() string {
	if s.backend != "" {
		return s.backend
	}
	return string(s.b(bucketMeta).Get(metaBackend))
}

// UniqueParticipants returns ps sorted, each participant once.
func UniqueParticipants(ps []Participant) []Participant { return sortParticipants(slices.Clone(ps)) }

func mergeParticipants(t *TxnRecord, ps []Participant) {
	t.Participants = sortParticipants(append(t.Participants, ps...))
}

func mergeSet(set []string, add ...string) []string {
	for _, a := range add {
		if a != "" && !slices.Contains(set, a) {
			set = append(set, a)
		}
	}
	slices.Sort(set)
	return set
}

func (s *applyState) storeTxn(id string, t *TxnRecord) { s.putJSON(bucketTxns, []byte(id), t) }

// setExpiry moves the pending decision's presumed-abort timer.
func (s *applyState) setExpiry(id string, t *TxnRecord, at int64) {
	if t.ExpiresAt != 0 {
		s.del(bucketTxnExp, timerKey(t.ExpiresAt, []byte(id)))
	}
	t.ExpiresAt = at
	if at != 0 {
		s.put(bucketTxnExp, timerKey(at, []byte(id)), nil)
		s.emit(Event{Kind: EventTimer, When: at})
	}
}

// setStagedUntil moves the time by which a transaction holding staged
// enqueues must be decided.
func (s *applyState) setStagedUntil(id string, t *TxnRecord, at int64) {
	if t.StagedUntil != 0 {
		s.del(bucketTxnStaged, timerKey(t.StagedUntil, []byte(id)))
	}
	t.StagedUntil = at
	s.put(bucketTxnStaged, timerKey(at, []byte(id)), nil)
	s.emit(Event{Kind: EventTimer, When: at})
}

// setDoubt moves the time at which the RM asks the home TC for a decision.
func (s *applyState) setDoubt(id string, t *TxnRecord, at int64) {
	if t.DoubtAt != 0 {
		s.del(bucketTxnDoubt, timerKey(t.DoubtAt, []byte(id)))
	}
	t.DoubtAt = at
	if at != 0 {
		s.put(bucketTxnDoubt, timerKey(at, []byte(id)), nil)
		s.emit(Event{Kind: EventDoubt, TxnID: id, When: at})
	}
}

// lockLocal checks every local participant for a conflict or an expired
// hold of txn and then locks the free ones for txn with leaseID until
// expiresAt. It changes nothing when it reports a problem.
func (s *applyState) lockLocal(txn string, t *TxnRecord, ps []Participant, owner, leaseID string, expiresAt int64) *errcode.Error {
	var err *errcode.Error
	n := 0
	locals(ps, func(p Participant) bool {
		n++
		r := s.resource(p)
		if holder, ok := r.holder(txn, owner); ok {
			err = lockConflict(holder)
		} else if r.expired(txn) {
			err = errcode.LeaseExpired.With("the hold of transaction %s on %s/%s expired", txn, p.Namespace, p.Key)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if leaseID == "" || tooLong(leaseID) {
		return errcode.MalformedCmd.With("locking participants needs a lease id of at most %d bytes", maxPartBytes)
	}
	if owner == "" {
		owner = "tc"
	}
	// grant extends the stored transaction record; it starts from this one.
	s.storeTxn(txn, t)
	w := Waiter{LeaseID: leaseID, TxnID: txn, Owner: owner, TTL: max(expiresAt-s.now, 1000)}
	locals(ps, func(p Participant) bool {
		s.resource(p).lock(txn, w)
		return true
	})
	if fresh := s.txn(txn); fresh != nil {
		t.Participants = fresh.Participants
	}
	return nil
}

// tooMany reports whether t would hold more than MaxParticipants with ps.
func tooMany(t *TxnRecord, ps []Participant) bool {
	return len(sortParticipants(append(slices.Clone(t.Participants), ps...))) > MaxParticipants
}

// txnDecide records this island's TC decision.
func (s *applyState) txnDecide(c *DecideCmd) *Result {
	if !validTxnID(c.TxnID) || !validState(c.State, true) || c.ExpiresAt < 0 || len(c.Participants) > MaxParticipants {
		return fail(errcode.MalformedCmd.With("decide needs a txn id and a state of pending, commit or rollback"))
	}
	ps, err := s.localize(c.Participants)
	if err != nil {
		return fail(err)
	}
	t := s.txn(c.TxnID)
	if t != nil && t.Home != "" {
		e := errcode.TxnNotHome.With("transaction %s is coordinated by island %s", c.TxnID, t.Home)
		return fail(e)
	}
	if t != nil && t.State != TxnPending {
		if c.State != t.State {
			return fail(decidedErr(t))
		}
		if s.decideAddsIslands() {
			if err := s.addIslands(c.TxnID, t, ps); err != nil {
				return fail(err)
			}
		}
		return &Result{Decision: t.State, Txn: txnInfo(c.TxnID, t)}
	}
	forgot := c.State != TxnRollback && s.forgotten(c.TxnID, t, ps)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	if tooMany(t, ps) {
		return fail(errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants))
	}
	if forgot {
		mergeParticipants(t, ps)
		s.storeTxn(c.TxnID, t)
		s.decideFinal(c.TxnID, false, ReasonPresumedAbort, forgottenDetail)
		return s.decided(c.TxnID)
	}
	switch c.State {
	case TxnPending:
		if max(c.ExpiresAt, t.ExpiresAt) <= s.now {
			return fail(errcode.MalformedCmd.With("a pending decision needs an expiry in the future"))
		}
		if err := s.lockLocal(c.TxnID, t, ps, c.Owner, c.LeaseID, c.ExpiresAt); err != nil {
			if err.Code != errcode.TxnLockConflict.Code {
				return fail(err)
			}
			// The conflict is the decision: roll back, remembered as final
			// so that a retry of this transaction fails at once.
			mergeParticipants(t, ps)
			s.storeTxn(c.TxnID, t)
			s.decideFinal(c.TxnID, false, ReasonLockConflict, err.Detail)
			return s.decided(c.TxnID)
		}
		mergeParticipants(t, ps)
		t.Prepared = mergeSet(t.Prepared, c.Prepared...)
		t.TCTerm = s.term
		s.setExpiry(c.TxnID, t, max(t.ExpiresAt, c.ExpiresAt))
		s.storeTxn(c.TxnID, t)
		return &Result{Decision: TxnPending, Txn: txnInfo(c.TxnID, t)}
	case TxnCommit:
		mergeParticipants(t, ps)
		t.Prepared = mergeSet(t.Prepared, c.Prepared...)
		for _, b := range t.Remotes() {
			if !slices.Contains(t.Prepared, b) {
				return fail(errcode.TxnPending.With("island %s has not prepared transaction %s", b, c.TxnID))
			}
		}
		s.storeTxn(c.TxnID, t)
		if s.expiredIn(c.TxnID, t) {
			s.decideFinal(c.TxnID, false, ReasonExpired, "a lease of the transaction expired")
		} else {
			s.decideFinal(c.TxnID, true, firstNonEmpty(c.Reason, ReasonTC), c.Detail)
		}
		return s.decided(c.TxnID)
	default:
		mergeParticipants(t, ps)
		s.storeTxn(c.TxnID, t)
		s.decideFinal(c.TxnID, false, firstNonEmpty(c.Reason, ReasonTC), c.Detail)
		return s.decided(c.TxnID)
	}
}

// addIslands merges into t, a decision already recorded, the participants
// of other islands that ps names and t does not, and queues the decision
// for fan-out to the islands it adds: as in lockd, a decide merges its
// participants with the record, so that naming a forgotten island's keys
// again tells that island the decision. Keys of this island add nothing:
// the decision was applied here to everything the transaction held. A
// record all islands had applied is taken off the retention timer
// (ReopenedAt; the sweep drops the older entry) until the new ones apply it.
func (s *applyState) addIslands(id string, t *TxnRecord, ps []Participant) *errcode.Error {
	var add []Participant
	for _, p := range ps {
		if p.Backend != "" && !slices.Contains(t.Participants, p) {
			add = append(add, p)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if tooMany(t, add) {
		return errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants)
	}
	wasDone := len(t.Unacked()) == 0
	mergeParticipants(t, add)
	if len(t.Unacked()) > 0 {
		if wasDone {
			t.ReopenedAt = s.now
		}
		s.put(bucketTxnFanout, timerKey(t.DecidedAt, []byte(id)), nil)
		s.emit(Event{Kind: EventFanout, TxnID: id})
	}
	s.storeTxn(id, t)
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *applyState) decided(id string) *Result {
	t := s.txn(id)
	return &Result{Decision: t.State, Txn: txnInfo(id, t)}
}

// staleTerm rejects a TC term older than the newest seen from home, and
// remembers term otherwise.
func (s *applyState) checkTerm(home string, term uint64) *errcode.Error {
	seen := u64(s.b(bucketTCTerms).Get([]byte(home)))
	if term < seen {
		return errcode.TCTermStale.With("term %d of island %s's coordinator is older than %d", term, home, seen)
	}
	return nil
}

func (s *applyState) noteTerm(home string, term uint64) {
	if term > u64(s.b(bucketTCTerms).Get([]byte(home))) {
		s.put(bucketTCTerms, []byte(home), putU64(term))
	}
}

func (s *applyState) rmChecks(txn, state, home string, term uint64, pendingOK bool, ps []Participant) ([]Participant, *errcode.Error) {
	if !validTxnID(txn) || !validState(state, pendingOK) || home == "" || hasNUL(home) || len(home) > 128 || term == 0 ||
		len(ps) > MaxParticipants {
		return nil, errcode.MalformedCmd.With("needs a txn id, a state, the home island and its coordinator's term")
	}
	if home == s.selfBackend() {
		return nil, errcode.TxnBackendMismatch.With("island %s is the transaction's home, not a resource manager for it", home)
	}
	local, err := s.localize(ps)
	if err != nil {
		return nil, err
	}
	for _, p := range local {
		if p.Backend != "" {
			return nil, errcode.TxnBackendMismatch.With("participant %s/%s belongs to island %s", p.Namespace, p.Key, p.Backend)
		}
	}
	return local, nil
}

// txnPrepare enlists and locks local participants for a remote TC.
func (s *applyState) txnPrepare(c *PrepareCmd) *Result {
	ps, err := s.rmChecks(c.TxnID, TxnPending, c.Home, c.Term, true, c.Participants)
	if err != nil {
		return fail(err)
	}
	if err := s.checkTerm(c.Home, c.Term); err != nil {
		return fail(err)
	}
	if c.ExpiresAt <= s.now {
		return fail(errcode.MalformedCmd.With("a prepare needs an expiry in the future"))
	}
	t := s.txn(c.TxnID)
	if t != nil && t.State != TxnPending {
		// The vote of a decided participant is its decision.
		return &Result{Decision: t.State, Txn: txnInfo(c.TxnID, t)}
	}
	if t != nil && t.Home != "" && t.Home != c.Home {
		return fail(errcode.TxnBackendMismatch.With("transaction %s is coordinated by island %s", c.TxnID, t.Home))
	}
	if t != nil && t.Home == "" && len(t.Remotes()) > 0 {
		return fail(errcode.TxnBackendMismatch.With("transaction %s is coordinated by this island", c.TxnID))
	}
	forgot := s.forgotten(c.TxnID, t, ps)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	if tooMany(t, ps) {
		return fail(errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants))
	}
	if forgot {
		// The vote is a rollback, recorded as the coordinator's decision
		// would be, so that nothing of the transaction is locked or
		// committed here.
		s.noteTerm(c.Home, c.Term)
		mergeParticipants(t, ps)
		t.Home, t.TCTerm = c.Home, c.Term
		s.storeTxn(c.TxnID, t)
		s.decideFinal(c.TxnID, false, ReasonPresumedAbort, forgottenDetail)
		return s.decided(c.TxnID)
	}
	if err := s.lockLocal(c.TxnID, t, ps, c.Owner, c.LeaseID, c.ExpiresAt); err != nil {
		return fail(err)
	}
	s.noteTerm(c.Home, c.Term)
	mergeParticipants(t, ps)
	t.Home, t.TCTerm = c.Home, c.Term
	t.ExpiresAt = max(t.ExpiresAt, c.ExpiresAt)
	// Without a decision by then, ask the home TC.
	s.setDoubt(c.TxnID, t, t.ExpiresAt)
	s.storeTxn(c.TxnID, t)
	return &Result{Decision: TxnPending, Txn: txnInfo(c.TxnID, t)}
}

// txnRMApply applies a remote TC's decision to the local participants.
func (s *applyState) txnRMApply(c *RMApplyCmd) *Result {
	ps, err := s.rmChecks(c.TxnID, c.State, c.Home, c.Term, false, c.Participants)
	if err != nil {
		return fail(err)
	}
	// A decision already applied is answered whatever the term: a late
	// repeat cannot change anything.
	t := s.txn(c.TxnID)
	if t != nil && t.State != TxnPending {
		if t.State == c.State {
			return &Result{Decision: t.State, Txn: txnInfo(c.TxnID, t)}
		}
		return fail(decidedErr(t))
	}
	if err := s.checkTerm(c.Home, c.Term); err != nil {
		return fail(err)
	}
	if t != nil && t.Home != "" && t.Home != c.Home {
		return fail(errcode.TxnBackendMismatch.With("transaction %s is coordinated by island %s", c.TxnID, t.Home))
	}
	// A commit of a transaction the island may have forgotten is refused,
	// and rolled back as a prepare of it would be: the transaction may
	// have held the participants here and rolled back (format 14).
	forgot := c.State == TxnCommit && s.rules() >= formatV14 && s.forgotten(c.TxnID, t, ps)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	s.noteTerm(c.Home, c.Term)
	mergeParticipants(t, ps)
	t.Home, t.TCTerm = c.Home, c.Term
	s.storeTxn(c.TxnID, t)
	if forgot {
		s.decideFinal(c.TxnID, false, ReasonPresumedAbort, forgottenDetail)
		return fail(decidedErr(s.txn(c.TxnID)))
	}
	s.decideFinal(c.TxnID, c.State == TxnCommit, ReasonTC, "")
	return s.decided(c.TxnID)
}

// txnAck notes islands that applied the decision; once every island has,
// the record only waits out its retention.
func (s *applyState) txnAck(c *AckCmd) *Result {
	if !validTxnID(c.TxnID) || len(c.Backends) == 0 {
		return fail(errcode.MalformedCmd.With("ack needs a txn id and backends"))
	}
	t := s.txn(c.TxnID)
	if t == nil || t.State == TxnPending || t.Home != "" {
		return fail(errcode.TxnPending.With("transaction %s has no decision of this coordinator", c.TxnID))
	}
	if len(t.Unacked()) == 0 {
		return &Result{Decision: t.State, Txn: txnInfo(c.TxnID, t)}
	}
	for _, b := range c.Backends {
		if slices.Contains(t.Remotes(), b) {
			t.Acked = mergeSet(t.Acked, b)
			if slices.Contains(c.Refused, b) && s.rules() >= formatV14 {
				t.Refused = mergeSet(t.Refused, b)
			}
		}
	}
	if len(t.Unacked()) == 0 {
		s.del(bucketTxnFanout, timerKey(t.DecidedAt, []byte(c.TxnID)))
		s.retain(c.TxnID, t)
	}
	s.storeTxn(c.TxnID, t)
	return &Result{Decision: t.State, Txn: txnInfo(c.TxnID, t)}
}

// retain starts the retention of t, a decision every island has applied:
// the sweep forgets it once the retention has passed since now, unless
// islands were added since.
func (s *applyState) retain(id string, t *TxnRecord) {
	s.put(bucketTxnDone, timerKey(s.now, []byte(id)), nil)
	if s.rules() >= formatV8 {
		t.DoneAt = s.now
	}
}

func (s *applyState) rmRegister(c *RMRegisterCmd) *Result {
	if c.Backend == "" || len(c.Backend) > 128 || hasNUL(c.Backend) || c.Endpoint == "" || len(c.Endpoint) > 512 {
		return fail(errcode.MalformedCmd.With("registration needs a backend hash and an endpoint"))
	}
	var e RMEntry
	s.getJSON(bucketRMs, []byte(c.Backend), &e)
	next, changed := e.Apply(*c, s.now)
	if !changed {
		return &Result{RM: &RMInfo{Backend: c.Backend, Entry: e}}
	}
	if next.UpdatedAt != e.UpdatedAt {
		s.put(bucketMeta, metaRMs, putU64(uint64(s.now)))
	}
	if len(next.Endpoints) == 0 && len(next.Removed) == 0 {
		s.del(bucketRMs, []byte(c.Backend))
	} else {
		s.putJSON(bucketRMs, []byte(c.Backend), next)
	}
	return &Result{RM: &RMInfo{Backend: c.Backend, Entry: next, Changed: true}}
}

// RMInfo is a registry entry in a result; Changed says whether the command
// changed it.
type RMInfo struct {
	Backend string  `json:"backend"`
	Entry   RMEntry `json:"entry"`
	Changed bool    `json:"changed,omitempty"`
}

// RMs lists the registry's islands, by backend hash: those with at least
// one endpoint.
func (v *View) RMs() map[string]RMEntry {
	out := v.RMRecords()
	maps.DeleteFunc(out, func(_ string, e RMEntry) bool { return len(e.Endpoints) == 0 })
	return out
}

// RMRecords lists every entry of the registry, by backend hash, including
// those that hold only removal records.
func (v *View) RMRecords() map[string]RMEntry {
	out := map[string]RMEntry{}
	c := v.b(bucketRMs).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		var e RMEntry
		if err := json.Unmarshal(raw, &e); err != nil {
			must(err)
		}
		out[string(k)] = e
	}
	return out
}

// RMsUpdatedAt returns when the registry last changed (Unix ms; 0 if it
// never did, or only before this was recorded).
func (v *View) RMsUpdatedAt() int64 { return int64(u64(v.b(bucketMeta).Get(metaRMs))) }

// TCTerm returns the newest term seen from the TC of island home.
func (v *View) TCTerm(home string) uint64 { return u64(v.b(bucketTCTerms).Get([]byte(home))) }

// Conflict is reader.Conflict on a view.
func (v *View) Conflict(ns, key, txn, owner string) (string, bool) {
	return v.reader.Conflict(ns, key, txn, owner)
}

// timerEach calls fn for the transactions of a timer index due at or
// before now, oldest first, until fn returns false.
func (v *View) timerEach(bucket []byte, now int64, fn func(id string) bool) {
	c := v.b(bucket).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		when, id := splitTimer(k)
		if when > now || !fn(string(id)) {
			return
		}
	}
}

// FanoutEach calls fn for the decisions of this coordinator that some
// island has not applied, oldest first, until fn returns false.
func (v *View) FanoutEach(fn func(id string) bool) { v.timerEach(bucketTxnFanout, 1<<62, fn) }

// DoubtEach calls fn for the prepared transactions due by now to ask their
// coordinator about, oldest first, until fn returns false.
func (v *View) DoubtEach(now int64, fn func(id string) bool) { v.timerEach(bucketTxnDoubt, now, fn) }

// NextDoubt returns the earliest time an in-doubt transaction is due.
func (v *View) NextDoubt() (int64, bool) {
	if k, _ := v.b(bucketTxnDoubt).Cursor().First(); k != nil {
		t, _ := splitTimer(k)
		return t, true
	}
	return 0, false
}

// StagedWrites counts the staged writes of every transaction.
func (v *View) StagedWrites() int { return v.b(staging.Bucket).Stats().KeyN }
