package tc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// byIsland groups the participants of other islands by backend hash.
func byIsland(ps []fsm.Participant, self string) map[string][]wire.TxnParticipant {
	out := map[string][]wire.TxnParticipant{}
	for _, p := range ps {
		if p.Backend == "" || p.Backend == self {
			continue
		}
		out[p.Backend] = append(out[p.Backend], wire.TxnParticipant{Namespace: p.Namespace, Key: p.Key, BackendHash: p.Backend})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// eachIsland runs fn for every island at once and returns the errors by
// island.
func eachIsland(islands []string, fn func(backend string) error) map[string]error {
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, b := range islands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(b); err != nil {
				mu.Lock()
				errs[b] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}

// prepareRemotes prepares the participants of every other island but the
// ones already prepared. A lock
// conflict anywhere is returned as such (permanent); a decided participant
// that rolled back is reported as txn_rolled_back; an island that cannot
// be reached is txn_island_unreachable (the transaction stays pending and
// may be retried).
func (c *Coordinator) prepareRemotes(ctx context.Context, d Decision, prepared []string) error {
	self := c.island.BackendHash()
	groups := byIsland(d.Participants, self)
	for _, b := range prepared {
		delete(groups, b)
	}
	if len(groups) == 0 {
		return nil
	}
	term := c.island.Term()
	errs := eachIsland(sortedKeys(groups), func(b string) error {
		req := wire.TxnDecisionRequest{TxnID: d.TxnID, State: fsm.TxnPending, Participants: groups[b],
			ExpiresAtUnix: (d.ExpiresAt.UnixMilli() + 999) / 1000, TCTerm: term, TargetBackendHash: b,
			TCBackendHash: self, Owner: d.Owner}
		return c.atIsland(ctx, b, func(ctx context.Context, ep string) error {
			resp, err := c.remote.Prepare(ctx, ep, req)
			if err == nil && resp.State == fsm.TxnRollback {
				return errcode.TxnRolledBack.With("island %s rolled transaction %s back", b, d.TxnID)
			}
			return err
		})
	})
	if len(errs) == 0 {
		return nil
	}
	// An island that answered a conflict or its own rollback holds
	// nothing for the transaction: the rollback need not be sent there.
	var settled []string
	var first *errcode.Error
	for _, code := range []string{errcode.TxnLockConflict.Code, errcode.TxnRolledBack.Code} {
		for _, b := range sortedKeys(errs) {
			if e := envelope(errs[b]); e != nil && e.Code == code {
				settled = append(settled, b)
				if first == nil {
					first = e
				}
			}
		}
	}
	if first != nil {
		return &refusal{err: first, settled: settled}
	}
	// An island that refused (its lease of the transaction expired, a
	// participant it cannot hold) votes no: the transaction cannot commit.
	for _, b := range sortedKeys(errs) {
		if !transient(errs[b]) {
			return errcode.TxnRolledBack.With("island %s refused to prepare transaction %s: %v", b, d.TxnID, errs[b])
		}
	}
	e := errcode.TxnUnreachable.With("preparing transaction %s: %s", d.TxnID, describe(errs))
	e.RetryAfter = 1
	return e
}

// refusal is a prepare refused for good, with the islands that hold
// nothing for the transaction because of it.
type refusal struct {
	err     error
	settled []string
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// fanout sends a final decision to every island that has not applied it
// and records which did; the settled islands hold nothing for it and are
// recorded without being sent anything. It answers txn_fanout_failed when
// an island is still missing after the retries; the decision stays
// recorded and the leader's resolver keeps replaying it. An island that
// had decided the transaction the other way counts as done, and is noted
// in info.Refused (mixed).
func (c *Coordinator) fanout(ctx context.Context, info *fsm.TxnInfo, settled ...string) error {
	if info.State == fsm.TxnPending || info.Home != "" {
		return nil
	}
	self := c.island.BackendHash()
	groups := byIsland(info.Participants, self)
	var todo, acked []string
	for _, b := range sortedKeys(groups) {
		switch {
		case slices.Contains(info.Acked, b):
		case slices.Contains(settled, b) && info.State == fsm.TxnRollback:
			acked = append(acked, b)
		default:
			todo = append(todo, b)
		}
	}
	if len(todo)+len(acked) == 0 {
		return nil
	}
	term := c.island.Term()
	errs := eachIsland(todo, func(b string) error {
		req := wire.TxnDecisionRequest{TxnID: info.TxnID, State: info.State, Participants: groups[b], TCTerm: term,
			TargetBackendHash: b, TCBackendHash: self}
		return c.atIsland(ctx, b, func(ctx context.Context, ep string) error {
			_, err := c.remote.Apply(ctx, ep, req)
			return err
		})
	})
	var refused []string
	for _, b := range todo {
		if e := envelope(errs[b]); e != nil && (e.Code == errcode.TxnCommitted.Code || e.Code == errcode.TxnRolledBack.Code) {
			// The island decided the transaction itself, before it was
			// prepared (a local release, a lease that expired there, a
			// transaction it forgot): nothing can change that, and
			// replaying would not end. It is recorded as refused, and
			// the decision answers that the outcome is mixed.
			c.cfg.Logger.Error("an island decided a transaction against its coordinator's decision",
				"txn", info.TxnID, "island", b, "decision", info.State, "error", e)
			delete(errs, b)
			refused = append(refused, b)
		}
		if errs[b] == nil {
			acked = append(acked, b)
		}
	}
	if len(acked) > 0 {
		res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpTxnAck, Ack: &fsm.AckCmd{TxnID: info.TxnID, Backends: acked,
			Refused: refused}})
		if err != nil {
			return err
		}
		// Before the island follows format 14 the record does not keep
		// the refusals: this answer still reports them.
		info.Acked, info.Refused = res.Txn.Acked, slices.Compact(slices.Sorted(slices.Values(append(res.Txn.Refused, refused...))))
	}
	if len(errs) > 0 {
		return errcode.TxnFanoutFailed.With("transaction %s is %s, but not applied everywhere yet: %s", info.TxnID, info.State, describe(errs))
	}
	return nil
}

// mixed reports a decision that some island had decided the other way
// before it was told (info.Refused): the transaction's outcome differs
// between its islands.
func mixed(info *fsm.TxnInfo) error {
	if len(info.Refused) == 0 {
		return nil
	}
	other := fsm.TxnRollback
	if info.State == fsm.TxnRollback {
		other = fsm.TxnCommit
	}
	return errcode.TxnOutcomeMixed.With("transaction %s is %s, but island %s had decided it %s before it was told",
		info.TxnID, info.State, strings.Join(info.Refused, ", "), other)
}

// fanoutQuietly fans a decision out without reporting failures: the
// resolver replays what is left.
func (c *Coordinator) fanoutQuietly(ctx context.Context, info *fsm.TxnInfo) {
	if err := c.fanout(ctx, info); err != nil {
		c.cfg.Logger.Warn("fan-out incomplete; the resolver will replay it", "txn", info.TxnID, "error", err)
	}
}

func describe(errs map[string]error) string {
	var parts []string
	for _, b := range sortedKeys(errs) {
		parts = append(parts, fmt.Sprintf("island %s: %v", b, errs[b]))
	}
	return strings.Join(parts, "; ")
}

func envelope(err error) *errcode.Error {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// permanent reports whether retrying err cannot help: the island answered
// with a rejection rather than failing to answer.
func permanent(err error) bool {
	var ce *client.Error
	if errors.As(err, &ce) {
		switch {
		case ce.Status == http.StatusRequestTimeout, ce.Status == http.StatusTooManyRequests, ce.Status == 499:
			return false
		case ce.Status >= 400 && ce.Status < 500:
			return true
		}
		return false
	}
	var e *errcode.Error
	return errors.As(err, &e) && (e.Code == errcode.TxnRolledBack.Code || e.Code == errcode.TxnLockConflict.Code ||
		e.Code == errcode.InvalidParams.Code)
}

// transient reports whether an island's error means it did not answer (it
// could not be reached, had no leader, was shutting down) rather than that
// it refused.
func transient(err error) bool {
	e := envelope(err)
	if e == nil {
		return true
	}
	switch e.Code {
	case errcode.TxnUnreachable.Code, errcode.NoLeader.Code, errcode.NotLeader.Code, errcode.Unavailable.Code,
		errcode.ShuttingDown.Code, errcode.NotReady.Code, errcode.RequestCancel.Code, errcode.Internal.Code:
		return true
	}
	return false
}

// endpoints returns the registered RM endpoints of island backend.
func (c *Coordinator) endpoints(ctx context.Context, backend string) ([]string, error) {
	var eps []string
	err := c.store.Read(ctx, func(v *fsm.View) error {
		eps = v.RMs()[backend].Endpoints
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, errcode.TxnUnreachable.With("no RM endpoint is registered for island %s", backend)
	}
	return eps, nil
}

// atIsland calls fn on the endpoints of island backend until it succeeds,
// fails for good, or the attempts are spent; attempts are spread over the
// island's endpoints and spaced by exponential backoff with full jitter.
// An endpoint that answers as another island counts as one that does not
// answer: the island is tried through its next endpoint.
func (c *Coordinator) atIsland(ctx context.Context, backend string, fn func(ctx context.Context, endpoint string) error) error {
	eps, err := c.endpoints(ctx, backend)
	if err != nil {
		return err
	}
	wait := backoff{bound: c.cfg.FanoutBaseDelay, max: c.cfg.FanoutMaxDelay, multiplier: c.cfg.FanoutMultiplier}
	start := rand.IntN(len(eps))
	for attempt := 0; ; attempt++ {
		ep := eps[(start+attempt)%len(eps)]
		actx, cancel := context.WithTimeout(ctx, c.cfg.FanoutTimeout)
		err = fn(actx, ep)
		cancel()
		if e := envelope(unwrapEnvelope(err)); e != nil && e.Code == errcode.TxnBackendMismatch.Code && e.Island != "" && e.Island != backend {
			// The endpoint is another island's: the island was not
			// reached there, whatever that island answered.
			ue := errcode.TxnUnreachable.With("endpoint %s registered for island %s serves island %s", ep, backend, e.Island)
			ue.RetryAfter = 1
			err = ue
		}
		if err == nil || permanent(err) || attempt+1 >= c.cfg.FanoutAttempts || ctx.Err() != nil {
			return unwrapEnvelope(err)
		}
		t := time.NewTimer(wait.next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return unwrapEnvelope(err)
		}
	}
}

// backoff spaces retries with full jitter: each wait is uniform in [0,
// bound], and the bound grows by multiplier after each wait, up to max.
type backoff struct {
	bound, max time.Duration
	multiplier float64
}

func (b *backoff) next() time.Duration {
	d := time.Duration(rand.Int64N(int64(b.bound) + 1))
	// In floating point, so that a large multiplier reaches the cap
	// rather than overflowing the duration.
	b.bound = time.Duration(min(float64(b.bound)*b.multiplier, float64(b.max)))
	return d
}

// unwrapEnvelope turns another island's error answer into its envelope, so
// that codes like txn_lock_conflict travel on unchanged; an island that did
// not answer with one (a transport failure, a body that is not an error
// envelope) is txn_island_unreachable.
func unwrapEnvelope(err error) error {
	if err == nil {
		return nil
	}
	var ce *client.Error
	if errors.As(err, &ce) && !strings.HasPrefix(ce.Envelope.Code, "http_") {
		return ce.Envelope
	}
	var e *errcode.Error
	if errors.As(err, &e) {
		return e
	}
	ue := errcode.TxnUnreachable.With("%v", err)
	ue.RetryAfter = 1
	return ue
}
