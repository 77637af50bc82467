// Package rm is the resource manager for keys: it turns lease and state
// requests (acquire, keepalive, update, remove, get, describe) into
// validated state machine commands and linearizable reads, and it parks a
// blocked acquirer until the replicated step that frees the key grants it the
// lease. It knows nothing about HTTP; package api decodes requests into the
// parameter structs defined here.
package rm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// Store is the replicated state as the resource manager uses it. Read
// reflects every write acknowledged before it began; ReadStale reads the
// local copy as it is.
type Store interface {
	Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error)
	Read(ctx context.Context, fn func(v *fsm.View) error) error
	ReadStale(ctx context.Context, fn func(v *fsm.View) error) error
}

// Consistency says how fresh a read must be.
type Consistency int

const (
	// Linearizable reads reflect every write acknowledged before the read
	// began (the default).
	Linearizable Consistency = iota
	// Stale reads return the serving node's state as it is, without asking
	// the leader: fast and available in a partition, possibly behind.
	Stale
)

func (k *Keys) read(ctx context.Context, c Consistency, fn func(v *fsm.View) error) error {
	if c == Stale {
		return k.store.ReadStale(ctx, fn)
	}
	return k.store.Read(ctx, fn)
}

// Clock tells the local time, used to judge lease expiry on reads.
type Clock interface{ Now() time.Time }

// Limits are the server's lease and state policies.
type Limits struct {
	DefaultTTL    time.Duration
	MaxTTL        time.Duration
	MaxBlock      time.Duration // longest an acquire waits; 0 never waits
	MaxStateBytes int64
}

// Keys serves lease and state operations on keys.
type Keys struct {
	store  Store
	waits  *Waits
	clock  Clock
	limits Limits
	node   Server
}

// Server names the server a service runs on: its id, and its run, which
// is new at every start, so that the requests a crash left waiting there
// can be told from the ones waiting now (fsm.DropWaitsCmd).
type Server struct{ ID, Run string }

// NewKeys wires a key service of server node. waits must be an observer of
// the state machine that store replicates; the leader tells node's waits of
// grants to the acquirers waiting there as soon as it applies them.
func NewKeys(store Store, waits *Waits, clock Clock, limits Limits, node Server) *Keys {
	return &Keys{store: store, waits: waits, clock: clock, limits: limits, node: node}
}

// AcquireParams is an acquire request.
type AcquireParams struct {
	Namespace   string
	Key         string // empty: the server picks a unique key
	Owner       string
	TxnID       string // empty: a new transaction
	RequestID   string // identifies retries of the same request; empty: none
	TTLSeconds  int64  // 0 or negative: default; above the maximum: the maximum
	BlockSecs   int64  // -1: never wait, 0: wait up to the server maximum, >0: wait that long (capped)
	IfNotExists bool
}

// Acquire grants a lease, waiting in FIFO order behind the current holder
// when allowed to. A retry carrying the RequestID of an earlier attempt gets
// that attempt's lease, or takes its place in the queue over (the attempt
// it replaced can then no longer withdraw it).
func (k *Keys) Acquire(ctx context.Context, p AcquireParams) (*fsm.LeaseInfo, error) {
	ns, err := Namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	own, err := owner(p.Owner)
	if err != nil {
		return nil, err
	}
	if err := idempotencyKey(p.RequestID); err != nil {
		return nil, err
	}
	key := p.Key
	if key == "" {
		// A retry of a key-less acquire must name the key its first
		// attempt was given.
		key = xid.New().String()
		if p.RequestID != "" {
			key = "k-" + digest(own, p.RequestID)[:20]
		}
	}
	if key, err = Key(key); err != nil {
		return nil, err
	}
	if fsm.IsMessageKey(key) {
		return nil, errcode.InvalidKey.With("keys of the form q/<queue>/msg/<id> name queue messages and cannot be acquired")
	}
	if fsm.IsStateKey(key) {
		return nil, errcode.InvalidKey.With("keys of the form q/<queue>/state/<id> hold queue messages' state and are leased with their message")
	}
	ttl := k.ttl(p.TTLSeconds)
	txn := p.TxnID
	if txn == "" {
		// Dated by the members' clock, not this server's own: islands
		// take a transaction whose id is dated a minute or more off
		// theirs for one they may have forgotten.
		txn = xid.NewWithTime(k.clock.Now()).String()
	} else if txn, err = TxnID(txn); err != nil {
		return nil, err
	}
	// The request id identifies retries of one acquire: the caller's
	// idempotency key, scoped to what it acquires and for whom, so that the
	// same key used elsewhere names a different request.
	req := xid.New().String()
	if p.RequestID != "" {
		req = idemPrefix + digest(ns, key, own, p.RequestID)[:32]
	}
	var wait time.Duration
	switch {
	case p.BlockSecs < -1:
		return nil, errcode.InvalidBlock.With("block_seconds must be -1, 0 or positive")
	case p.BlockSecs == 0:
		wait = k.limits.MaxBlock
	case p.BlockSecs > 0 && p.BlockSecs < int64(k.limits.MaxBlock/time.Second):
		wait = time.Duration(p.BlockSecs) * time.Second
	case p.BlockSecs > 0:
		wait = k.limits.MaxBlock
	}
	attempt := xid.New().String()
	cmd := &fsm.AcquireCmd{Namespace: ns, Key: key, Owner: own, TxnID: txn, LeaseID: xid.New().String(),
		RequestID: req, TTL: ttl.Milliseconds(), Wait: wait.Milliseconds(), IfNotExists: p.IfNotExists, Attempt: attempt,
		Node: k.node.ID, Run: k.node.Run}
	events, unregister := k.waits.register(req, attempt, waitAcquire)
	defer unregister()
	res, ev, inLine, err := proposeAndWait(ctx, k.store, wait, events, func(left int64) *fsm.Command {
		cmd.Wait = left
		return &fsm.Command{Op: fsm.OpAcquire, Acquire: cmd}
	}, func(r *fsm.Result) bool { return r.Lease != nil }, nil)
	switch {
	case err != nil:
		// The acquire may have been applied all the same: a queued request
		// nobody waits for must leave the queue.
		if wait > 0 && mayStandInLine(res, err) {
			awaitAnswer(ctx, err)
			// Applied, if at all, before the answer that has come by now.
			res, cerr := k.withdraw(ctx, ns, key, req, attempt, time.Now().Add(wait))
			if cerr == nil && res.Lease != nil {
				return res.Lease, nil
			}
			// A request that stood in line before a restore had it
			// proposed again may stand in it still: err (not_leader, say)
			// speaks only of the last proposal.
			if cerr != nil && errors.As(err, new(queuedBefore)) {
				return nil, errcode.Unavailable.With("acquire %s/%s: the request stood in line, and may still: "+
					"%v; its withdrawal failed: %v", ns, key, err, cerr)
			}
		}
		return nil, err
	case res != nil:
		return res.Lease, nil
	case ev != nil && ev.Lease != nil:
		return ev.Lease, nil
	case ev != nil:
		return nil, ev.Err
	}
	// Stop waiting: leave the queue, unless the lease arrived meanwhile.
	res, err = k.withdraw(ctx, ns, key, req, attempt, inLine)
	if err != nil {
		return nil, err
	}
	if res.Lease != nil {
		return res.Lease, nil
	}
	// A caller that went away gets the reason; one whose deadline passed
	// while it waited gets the answer of a wait that ran out.
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("rm: acquire %s/%s: %w", ns, key, err)
	}
	e := errcode.Waiting.With("lease still held after waiting %s", wait)
	if ctx.Err() != nil {
		e = errcode.Waiting.With("lease still held when the request's deadline passed")
	}
	e.RetryAfter = max(1, res.RetryAfter)
	return nil, e
}

// idemPrefix begins the request id of an acquire named by the caller's
// idempotency key: its retries, on any server, share the id.
const idemPrefix = "idem-"

// proposeAndWait proposes the command cmd makes for a wait of left
// milliseconds and, unless its result settles the request, waits up to
// wait for the event that ends it. It returns the settling result, or the
// event, or neither once wait has passed or ctx ended, and when the
// request's wait ends at the latest in the replicated state (inLine): the
// leader applied its last proposal before answering it, and a proposal
// that took long to reach a leader (an election first) waits that much
// past wait on this server. A state restored
// from a backup (or installed from the leader's snapshot) may have lost
// the line the request stood in, or the event that ended its wait: the
// request is proposed again for what is left of the wait (a request still
// in line keeps its place), after recheck, when given, found it unsettled;
// recheck may give the events of the request proposed from then on.
func proposeAndWait(ctx context.Context, s Store, wait time.Duration, events <-chan fsm.Event,
	cmd func(left int64) *fsm.Command, settled func(*fsm.Result) bool,
	recheck func() (*fsm.Result, <-chan fsm.Event, error)) (_ *fsm.Result, _ *fsm.Event, inLine time.Time, _ error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	until := time.Now().Add(wait)
	left := wait.Milliseconds()
	for first := true; ; first = false {
		res, err := s.Propose(ctx, cmd(left))
		inLine = time.Now().Add(time.Duration(left) * time.Millisecond)
		if first && errors.Is(err, errcode.NoLeader) {
			return nil, nil, inLine, nothingQueued{err}
		}
		if err != nil && !first {
			return res, nil, inLine, queuedBefore{err}
		}
		if err != nil || settled(res) {
			return res, nil, inLine, err
		}
		select {
		case ev := <-events:
			if ev.Kind == fsm.EventRestored {
				if recheck != nil {
					res, ch, err := recheck()
					if err != nil || settled(res) {
						return res, nil, inLine, err
					}
					if ch != nil {
						events = ch
					}
				}
				left = max(1, time.Until(until).Milliseconds())
				continue
			}
			return nil, &ev, inLine, nil
		case <-timer.C:
		case <-ctx.Done():
		}
		return nil, nil, inLine, nil
	}
}

// nothingQueued is the failure of a request whose command never reached a
// leader (none was elected in time): it stands in no queue, and there is
// nothing to withdraw.
type nothingQueued struct{ error }

func (e nothingQueued) Unwrap() error { return e.error }

// queuedBefore is the failure of a request proposed again after a restore:
// its first proposal was applied.
type queuedBefore struct{ error }

func (e queuedBefore) Unwrap() error { return e.error }

// mayStandInLine tells whether a waiting request that failed with err may
// have been queued all the same (a forward cut short), and so must be
// withdrawn: not when it has a result (a refusal of the state machine
// queued nothing) or never reached a leader.
func mayStandInLine(res *fsm.Result, err error) bool {
	var nq nothingQueued
	return res == nil && !errors.As(err, &nq)
}

// awaitAnswer waits, for at most ten seconds whatever became of ctx and
// no longer than the server runs (WithServerLife), for the leader's answer
// to a forwarded request that failed with err before it came (the store's
// error then has an AwaitAnswer method). The request
// may still be applied, and its withdrawal, sent before the leader took
// the request up, could be applied first and find nothing to withdraw,
// leaving the request in line for nobody.
func awaitAnswer(ctx context.Context, err error) {
	var pending interface{ AwaitAnswer(ctx context.Context) }
	if !errors.As(err, &pending) {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	defer context.AfterFunc(serverLife(ctx), cancel)()
	pending.AwaitAnswer(actx)
}

// withdraw takes the acquire attempt out of the key's queue, whatever
// became of ctx; the answer holds the lease when it was granted first.
// The attempt may wait in the queue until about until (proposeAndWait's
// inLine): while no leader takes the withdrawal (an election, a partition
// longer than the node waits for a leader), it is sent again until then,
// or a release after the outage would grant the key to a client that is
// gone, for its whole TTL.
func (k *Keys) withdraw(ctx context.Context, ns, key, req, attempt string, until time.Time) (*fsm.Result, error) {
	return proposeUntil(ctx, k.store, &fsm.Command{Op: fsm.OpCancelWait,
		CancelWait: &fsm.CancelWaitCmd{Namespace: ns, Key: key, RequestID: req, Attempt: attempt}}, until.Add(withdrawSlack))
}

// withdrawSlack is how long after this server reckons a queued request's
// wait ends it is still taken to wait in the replicated state: its deadline
// is on the replicated clock, which may not keep pace with this server's
// (it holds still while a leader whose clock was found ahead catches up).
const withdrawSlack = 2 * time.Second

// proposeUntil proposes cmd, which must be idempotent, as proposeDetached
// does, and again, with growing pauses, while it failed without reaching
// the state machine and until has not passed. A server shutting down
// stops trying, also for a request whose client had left before (its
// context ended then, and shows nothing of the shutdown): its next start
// withdraws what it left waiting (fsm.DropWaitsCmd).
func proposeUntil(ctx context.Context, s Store, cmd *fsm.Command, until time.Time) (*fsm.Result, error) {
	life := serverLife(ctx)
	pause := 50 * time.Millisecond
	for {
		res, err := proposeDetached(ctx, s, cmd)
		if err == nil || res != nil || errors.Is(err, errcode.ShuttingDown) ||
			errors.Is(context.Cause(ctx), errcode.ShuttingDown) || time.Now().Add(pause).After(until) {
			return res, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-life.Done():
			t.Stop()
			return res, err
		}
		pause = min(2*pause, time.Second)
	}
}

// lifeKey is the context key under which WithServerLife keeps the
// server's life.
type lifeKey struct{}

// WithServerLife returns ctx carrying life, a context that ends when the
// server serving the requests whose contexts derive from ctx shuts down.
// A request's own context, once its client left, no longer shows the
// shutdown; the work it does on afterwards (withdrawing a waiting acquire
// or dequeue) stops waiting at it.
func WithServerLife(ctx, life context.Context) context.Context {
	return context.WithValue(ctx, lifeKey{}, life)
}

// serverLife is the life WithServerLife gave ctx; without one, a context
// that never ends.
func serverLife(ctx context.Context) context.Context {
	if life, ok := ctx.Value(lifeKey{}).(context.Context); ok {
		return life
	}
	return context.Background()
}

// proposeDetached proposes cmd whatever became of ctx (a request that stops
// waiting still has to leave its queue), within ten seconds.
func proposeDetached(ctx context.Context, s Store, cmd *fsm.Command) (*fsm.Result, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return s.Propose(cctx, cmd)
}

// ttl resolves a requested TTL as lockd does: zero or negative is the
// default, more than the maximum is the maximum.
func (k *Keys) ttl(secs int64) time.Duration {
	switch {
	case secs <= 0:
		return k.limits.DefaultTTL
	case secs > int64(k.limits.MaxTTL/time.Second):
		return k.limits.MaxTTL
	}
	return time.Duration(secs) * time.Second
}

// LeaseRef names a lease and the proofs a request carries for it.
type LeaseRef struct {
	Namespace string
	Key       string
	LeaseID   string
	TxnID     string // optional unless the operation requires it
	Token     int64  // 0: not given
}

// Validate checks and normalises the reference; txnRequired makes a
// missing transaction id an error.
func (r LeaseRef) Validate(txnRequired bool) (LeaseRef, error) {
	var err error
	if r.Namespace, r.Key, err = Resource(r.Namespace, r.Key); err != nil {
		return r, err
	}
	if r.LeaseID, err = LeaseID(r.LeaseID); err != nil {
		return r, err
	}
	if r.TxnID == "" {
		if txnRequired {
			return r, errcode.MissingTxn.With("txn id is required")
		}
	} else if r.TxnID, err = TxnID(r.TxnID); err != nil {
		return r, err
	}
	if r.Token < 0 {
		return r, errcode.InvalidFencing.With("fencing token must be positive")
	}
	return r, nil
}

// KeepAlive extends a lease by ttlSeconds: 0 extends it by its own TTL, a
// negative value by the default TTL, more than the maximum by the maximum.
// A lease whose own TTL is longer than the maximum (acquired before
// --max-ttl was lowered) is extended by the maximum (from rules format 10
// on: fsm.KeepAliveCmd.Max).
func (k *Keys) KeepAlive(ctx context.Context, ref LeaseRef, ttlSeconds int64) (*fsm.LeaseInfo, error) {
	ref, err := ref.Validate(false)
	if err != nil {
		return nil, err
	}
	var ttl time.Duration
	if ttlSeconds != 0 {
		ttl = k.ttl(ttlSeconds)
	}
	res, err := k.store.Propose(ctx, &fsm.Command{Op: fsm.OpKeepAlive, KeepAlive: &fsm.KeepAliveCmd{
		Namespace: ref.Namespace, Key: ref.Key, LeaseID: ref.LeaseID, TxnID: ref.TxnID, Token: ref.Token, TTL: ttl.Milliseconds(),
		Max: k.limits.MaxTTL.Milliseconds()}})
	if err != nil {
		return nil, err
	}
	return res.Lease, nil
}

// Conditions guard a write with compare-and-swap checks.
type Conditions struct {
	IfVersion *int64
	IfETag    string
}

// Body is a submitted document with its optional integrity claims.
type Body struct {
	R              io.Reader
	ExpectedSHA256 string // hex; "": not given
	ExpectedBytes  int64  // -1: not given
}

// digest hashes its parts, separated so that ("ab","c") and ("a","bc") differ.
func digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Update stages a new JSON document under the lease's transaction.
func (k *Keys) Update(ctx context.Context, ref LeaseRef, cond Conditions, body Body) (*fsm.WriteResult, error) {
	ref, err := ref.Validate(true)
	if err != nil {
		return nil, err
	}
	doc, etag, err := ReadDocument(body, k.limits.MaxStateBytes)
	if err != nil {
		return nil, err
	}
	return k.write(ctx, ref, cond, &fsm.WriteCmd{ETag: etag, Doc: doc})
}

// Remove stages the removal of the key's document.
func (k *Keys) Remove(ctx context.Context, ref LeaseRef, cond Conditions) (*fsm.WriteResult, error) {
	ref, err := ref.Validate(true)
	if err != nil {
		return nil, err
	}
	return k.write(ctx, ref, cond, &fsm.WriteCmd{Delete: true})
}

func (k *Keys) write(ctx context.Context, ref LeaseRef, cond Conditions, w *fsm.WriteCmd) (*fsm.WriteResult, error) {
	w.Namespace, w.Key, w.LeaseID, w.TxnID, w.Token = ref.Namespace, ref.Key, ref.LeaseID, ref.TxnID, ref.Token
	w.IfVersion = cond.IfVersion
	// As in lockd, a condition that is not blank is checked, even one
	// that names the empty ETag ("") of a key without a document.
	if etag := strings.TrimSpace(cond.IfETag); etag != "" {
		w.IfETag, w.IfETagSet = strings.Trim(etag, `"`), true
	}
	if w.IfETagSet && w.IfETag == "" {
		// Rules only rise, and a server's state is a prefix of the
		// leader's: rules this server follows hold where the write applies.
		checks := false
		if err := k.store.ReadStale(ctx, func(v *fsm.View) error { checks = v.ChecksEmptyETag(); return nil }); err != nil {
			return nil, err
		}
		if !checks {
			e := errcode.Unavailable.With("the island does not check an empty X-If-State-ETag until every server " +
				"follows its newest rules (a cluster founded within the last seconds, or one being upgraded); retry")
			e.RetryAfter = 1
			return nil, e
		}
	}
	res, err := k.store.Propose(ctx, &fsm.Command{Op: fsm.OpWrite, Write: w})
	if err != nil {
		return nil, err
	}
	return res.Write, nil
}

// ReadDocument reads a JSON document of at most limit bytes, checks the
// claimed checksum and length of what was sent, and returns it compacted
// together with its ETag (the hex SHA-256 of the compact form).
func ReadDocument(b Body, limit int64) ([]byte, string, error) {
	if b.R == nil {
		return nil, "", errcode.MissingBody.With("a JSON document is required")
	}
	raw, err := io.ReadAll(io.LimitReader(b.R, limit+1))
	if err != nil {
		return nil, "", errcode.InvalidBody.With("reading body: %v", err)
	}
	if int64(len(raw)) > limit {
		return nil, "", errcode.StateTooLarge.With("state exceeds %d bytes", limit)
	}
	if b.ExpectedBytes >= 0 && int64(len(raw)) != b.ExpectedBytes {
		return nil, "", errcode.SizeMismatch.With("body has %d bytes, not %d", len(raw), b.ExpectedBytes)
	}
	if b.ExpectedSHA256 != "" {
		if !ValidSHA256(b.ExpectedSHA256) {
			return nil, "", errcode.InvalidChecksum.With("expected SHA-256 must be 64 hex digits")
		}
		sum := sha256.Sum256(raw)
		if !strings.EqualFold(hex.EncodeToString(sum[:]), b.ExpectedSHA256) {
			return nil, "", errcode.ChecksumMismatch.With("body does not match the expected SHA-256")
		}
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, "", errcode.MissingBody.With("a JSON document is required")
	}
	var out bytes.Buffer
	if err := json.Compact(&out, raw); err != nil {
		return nil, "", errcode.InvalidBody.With("state is not valid JSON: %v", err)
	}
	if !utf8.Valid(raw) { // Compact checked the rest
		return nil, "", errcode.InvalidBody.With("state is not valid JSON: invalid UTF-8")
	}
	sum := sha256.Sum256(out.Bytes())
	return out.Bytes(), hex.EncodeToString(sum[:]), nil
}

// ValidSHA256 reports whether s is a hex SHA-256 digest (either case).
func ValidSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// Get returns the document the caller may see: the committed one for a
// public read, the holder's view (including its staged write) otherwise.
func (k *Keys) Get(ctx context.Context, ref LeaseRef, public bool, c Consistency) (fsm.Doc, error) {
	var err error
	if public {
		if ref.Namespace, ref.Key, err = Resource(ref.Namespace, ref.Key); err != nil {
			return fsm.Doc{}, err
		}
	} else if ref, err = ref.Validate(false); err != nil {
		return fsm.Doc{}, err
	}
	var doc fsm.Doc
	err = k.read(ctx, c, func(v *fsm.View) error {
		if public {
			doc = v.PublicDoc(ref.Namespace, ref.Key)
			return nil
		}
		var err error
		doc, err = v.LeaseDoc(ref.Namespace, ref.Key, ref.LeaseID, ref.TxnID, ref.Token, k.clock.Now().UnixMilli())
		return err
	})
	return doc, err
}

// Description is a key's lease and committed-state metadata.
type Description struct {
	Namespace string
	Key       string
	Record    fsm.KeyRecord
	Exists    bool
}

// Describe returns a key's metadata without its document.
func (k *Keys) Describe(ctx context.Context, ns, key string, c Consistency) (Description, error) {
	ns, key, err := Resource(ns, key)
	if err != nil {
		return Description{}, err
	}
	d := Description{Namespace: ns, Key: key}
	err = k.read(ctx, c, func(v *fsm.View) error {
		d.Record, d.Exists = v.Key(ns, key)
		return nil
	})
	return d, err
}
