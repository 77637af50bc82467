package tc

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/leaderloop"
	"github.com/raftlockd/raftlockd/wire"
)

// Resolver runs on the Raft leader only and finishes what requests left
// unfinished: it replays decisions of this coordinator that other islands
// have not applied, asks coordinating islands for the decisions that
// prepared participants here are waiting for, and keeps this island's
// entry in the RM registry current on every island it knows. Work that
// fails is retried with exponential backoff, kept in memory: a new leader
// starts over at once.
type Resolver struct {
	c        *Coordinator
	interval time.Duration // longest sleep between rounds
	registry time.Duration // how often the island re-registers itself

	kick chan struct{}

	leaderloop.Loop
	mu     sync.Mutex
	rounds int
}

// NewResolver returns a stopped resolver for c.
func NewResolver(c *Coordinator, interval, registry time.Duration) *Resolver {
	if interval <= 0 {
		interval = time.Second
	}
	if registry <= 0 {
		registry = 10 * time.Second
	}
	return &Resolver{c: c, interval: interval, registry: registry, kick: make(chan struct{}, 1)}
}

// SetLeader starts the resolver when this node gains leadership and stops
// it when leadership is lost. It does not block.
func (r *Resolver) SetLeader(isLeader bool) { r.Set(isLeader, r.run) }

// Rounds counts the rounds the loop has started (for tests and metrics).
func (r *Resolver) Rounds() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rounds
}

// Kick wakes the resolver for an early round.
func (r *Resolver) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Observe implements fsm.Observer: a new decision to fan out, a
// transaction falling in doubt or a restored state wakes the loop.
func (r *Resolver) Observe(events []fsm.Event) {
	for _, e := range events {
		if e.Kind == fsm.EventFanout || e.Kind == fsm.EventDoubt || e.Kind == fsm.EventRestored {
			r.Kick()
			return
		}
	}
}

// retry is the backoff state of one piece of work.
type retry struct {
	at    time.Time
	delay time.Duration
}

// work is what one leader's resolver has going: the backoff of the work
// that failed and the work in flight. Jobs run in goroutines of their own
// and settle their outcome here when they end, so that an island that
// does not answer holds up only the work it is part of, not the rounds
// after it.
type work struct {
	mu      sync.Mutex
	backoff map[string]retry
	busy    map[string]bool
	wg      sync.WaitGroup
}

// maxInFlight bounds the jobs running at once.
const maxInFlight = 256

func (r *Resolver) run(ctx context.Context) {
	w := &work{backoff: map[string]retry{}, busy: map[string]bool{}}
	defer w.wg.Wait() // the jobs end with ctx
	var lastRegistry time.Time
	syncEvery := r.registry
	var failed time.Duration // the pause after the last failed sync; 0 after a success
	synced := make(chan error, 1)
	syncing := false
	for {
		now := r.c.clock.Now()
		// A sync that is due anyway also serves what the island learned.
		// It runs beside the rounds: an island that does not answer
		// would hold each of them up by the fan-out timeout.
		if !syncing {
			if learned := r.c.learned.Swap(false); learned || now.Sub(lastRegistry) >= syncEvery {
				lastRegistry, syncing = now, true
				w.wg.Go(func() { synced <- r.c.SyncRegistry(ctx) })
			}
		}
		next := r.launch(ctx, w)
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.rounds++
		r.mu.Unlock()
		wait := r.interval
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(r.c.clock.Now()), time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.kick:
		case err := <-synced:
			// A failed sync is tried again after a growing pause (up to
			// the interval), not every round.
			syncing = false
			switch {
			case err == nil:
				syncEvery, failed = r.registry, 0
			case ctx.Err() == nil:
				failed = min(max(2*failed, time.Second), r.registry)
				syncEvery = failed
				r.c.cfg.Logger.Warn("registering this island with the others failed; trying again later",
					"retry_in", syncEvery, "error", err)
			}
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// round does the work that is due, waits for it to end and returns when
// the next is (zero: nothing scheduled).
func (r *Resolver) round(ctx context.Context, backoff map[string]retry) (next time.Time) {
	w := &work{backoff: backoff, busy: map[string]bool{}}
	next = r.launch(ctx, w)
	w.wg.Wait()
	for _, b := range backoff {
		if next.IsZero() || b.at.Before(next) {
			next = b.at
		}
	}
	return next
}

// launch starts the work that is due and neither backing off nor in
// flight, and returns when the next is (zero: nothing scheduled). Work
// that is backing off is passed over, so that it never holds up what comes
// after it.
func (r *Resolver) launch(ctx context.Context, w *work) (next time.Time) {
	const batch, scan = 64, 10000
	now := r.c.clock.Now()
	plan := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	w.mu.Lock()
	backoff, busy := maps.Clone(w.backoff), maps.Clone(w.busy)
	w.mu.Unlock()
	room := maxInFlight - len(busy)
	// pick collects due work that is not backing off or in flight, and no
	// decision a request is fanning out (if that fails, a later round
	// replays it): a batch of such decisions would otherwise leave the
	// round with nothing to do and the work after them unreached.
	pick := func(kind string, out *[]string) func(id string) bool {
		seen := 0
		return func(id string) bool {
			seen++
			_, fanning := r.c.fanning.Load(id)
			switch b, ok := backoff[kind+id]; {
			case kind == "fanout/" && fanning, busy[kind+id]:
			case ok && now.Before(b.at):
				plan(b.at)
			default:
				*out = append(*out, id)
			}
			return len(*out) < min(batch, room/2) && seen < scan
		}
	}
	var fan, doubt []string
	var nextDoubt int64
	var hasDoubt bool
	if room >= 2 {
		err := r.c.store.Read(ctx, func(v *fsm.View) error {
			v.FanoutEach(pick("fanout/", &fan))
			v.DoubtEach(now.UnixMilli(), pick("doubt/", &doubt))
			nextDoubt, hasDoubt = v.NextDoubt()
			return nil
		})
		if err != nil {
			return now.Add(r.interval)
		}
	}
	// Each job runs at once and on its own: an island that does not
	// answer holds up only the work it is part of; its backoff is settled
	// when it ends.
	type job struct {
		key string
		do  func() error
	}
	var jobs []job
	for _, id := range fan {
		if _, busy := r.c.fanning.Load(id); busy {
			continue // a request began fanning it out since the read
		}
		jobs = append(jobs, job{"fanout/" + id, func() error {
			rec, err := r.c.record(ctx, id)
			if err != nil || rec == nil {
				return err
			}
			return r.c.fanout(ctx, recordInfo(rec))
		}})
	}
	for _, id := range doubt {
		jobs = append(jobs, job{"doubt/" + id, func() error {
			rec, err := r.c.record(ctx, id)
			if err != nil || rec == nil || rec.State != fsm.TxnPending || rec.Home == "" {
				return err
			}
			_, err = r.c.resolveDoubt(ctx, rec)
			return err
		}})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, j := range jobs {
		w.busy[j.key] = true
		w.wg.Go(func() {
			err := j.do()
			r.settle(ctx, w, j.key, err)
		})
	}
	if hasDoubt && nextDoubt > now.UnixMilli() {
		plan(time.UnixMilli(nextDoubt))
	}
	if len(fan) == batch || len(doubt) == batch {
		plan(now) // more is due right away
	}
	// Forget the backoff of work that is long gone.
	for key, b := range w.backoff {
		if !w.busy[key] && now.Sub(b.at) > 2*time.Minute {
			delete(w.backoff, key)
		}
	}
	return next
}

// settle records how a job ended: work that failed is tried again after a
// growing pause, which the loop is woken to plan (as it is when work
// succeeded: its slot is free).
func (r *Resolver) settle(ctx context.Context, w *work, key string, err error) {
	w.mu.Lock()
	delete(w.busy, key)
	if err == nil {
		delete(w.backoff, key)
		w.mu.Unlock()
		r.Kick() // its slot is free for work a full round left waiting
		return
	}
	b := w.backoff[key]
	b.delay = min(max(b.delay*2, r.c.cfg.FanoutBaseDelay), time.Minute)
	b.at = r.c.clock.Now().Add(b.delay)
	w.backoff[key] = b
	w.mu.Unlock()
	r.Kick()
	if ctx.Err() == nil {
		r.c.cfg.Logger.Warn("transaction not finished yet; retrying", "work", key, "retry_in", b.delay, "error", err)
	}
}

// Register records a registration (or removal) of an RM endpoint of
// island ch.Backend in this island's registry through Raft, and passes it
// on to every other island in the registry with the time the change was
// made, so that islands learn about each other. What takes effect is
// decided by fsm.RMEntry.Apply (last writer wins per endpoint). When the
// change cannot be replicated everywhere it answers
// tc_rm_replication_failed (what was recorded stays). An operator's
// request (not PassedOn) is passed on even when this island has the change
// already, with the time recorded for it, so that retrying it reaches the
// islands that missed it; a change passed on by another island goes
// further only when it changed something here, which ends the passing on.
func (c *Coordinator) Register(ctx context.Context, ch fsm.RMRegisterCmd) (fsm.RMInfo, error) {
	rms, all, err := c.registry(ctx)
	if err != nil {
		return fsm.RMInfo{}, errcode.TCRMReplication.With("reading the registry: %v", err)
	}
	legacy := withDefaultPort(ch.Endpoint)
	if at, _, _ := all[ch.Backend].ChangedAt(legacy); slices.Contains(all[ch.Backend].Endpoints, legacy) &&
		(!ch.PassedOn || ch.ChangedAt > at || ch.ChangedAt == at && ch.Remove) {
		// The endpoint as older servers recorded it, with its scheme's
		// default port: the change is of that one endpoint, so the old
		// spelling goes, unless the change is another island's older
		// than it (last writer wins, as fsm.RMEntry.Apply rules). Only
		// here: another island passed this change drops its own old
		// spelling the same way.
		drop := fsm.RMRegisterCmd{Backend: ch.Backend, Endpoint: legacy, Remove: true}
		if _, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRMRegister, RMRegister: &drop}); err != nil {
			return fsm.RMInfo{}, errcode.TCRMReplication.With("removing %s, recorded in another spelling: %v", legacy, err)
		}
		if rms, all, err = c.registry(ctx); err != nil {
			return fsm.RMInfo{}, errcode.TCRMReplication.With("reading the registry: %v", err)
		}
	}
	info := fsm.RMInfo{Backend: ch.Backend, Entry: all[ch.Backend]}
	if _, changes := info.Entry.Apply(ch, c.clock.Now().UnixMilli()); changes {
		res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRMRegister, RMRegister: &ch})
		if err != nil {
			if e := envelope(err); e != nil && e.Code == errcode.MalformedCmd.Code {
				return fsm.RMInfo{}, errcode.InvalidParams.With("%s", e.Detail)
			}
			return fsm.RMInfo{}, errcode.TCRMReplication.With("recording the registration: %v", err)
		}
		info = *res.RM
	}
	if !info.Changed && ch.PassedOn {
		return info, nil
	}
	if _, known := rms[ch.Backend]; !known && len(info.Entry.Endpoints) > 0 {
		c.learned.Store(true)
	}
	self := c.island.BackendHash()
	var others []string
	for _, b := range sortedKeys(rms) {
		if b != self && b != ch.Backend {
			others = append(others, b)
		}
	}
	at, _, _ := info.Entry.ChangedAt(ch.Endpoint)
	req := wire.TCRMRegisterRequest{BackendHash: ch.Backend, Endpoint: ch.Endpoint, PassedOn: true, ChangedAtUnixMs: at}
	errs := eachIsland(others, func(b string) error {
		return c.atIsland(ctx, b, func(ctx context.Context, ep string) error {
			_, err := c.remote.Register(ctx, ep, req, ch.Remove)
			return err
		})
	})
	if len(errs) > 0 {
		return info, errcode.TCRMReplication.With("recorded here, but not on every island: %s", describe(errs))
	}
	return info, nil
}

// RMs returns the registry.
func (c *Coordinator) RMs(ctx context.Context) (map[string]fsm.RMEntry, error) {
	out, _, err := c.Registry(ctx)
	return out, err
}

// Registry returns the registry and when it last changed (Unix ms).
func (c *Coordinator) Registry(ctx context.Context) (map[string]fsm.RMEntry, int64, error) {
	var out map[string]fsm.RMEntry
	var updated int64
	err := c.store.Read(ctx, func(v *fsm.View) error {
		out, updated = v.RMs(), v.RMsUpdatedAt()
		return nil
	})
	return out, updated, err
}

// registry returns the registry's islands (those with endpoints) and every
// entry, those holding only removal records included.
func (c *Coordinator) registry(ctx context.Context) (rms, all map[string]fsm.RMEntry, err error) {
	err = c.store.Read(ctx, func(v *fsm.View) error {
		rms, all = v.RMs(), v.RMRecords()
		return nil
	})
	return rms, all, err
}

// SyncRegistry records this island's member endpoints in its own registry
// (membership is the truth for the island's own entry: a member missing
// from it is registered again at the current time, which wins over an
// older removal) and tells every other island it knows (the configured
// peers and the registry's islands) what its registry holds: each
// endpoint with the time it was registered, and each removal record with
// the time of the removal, so that an island that missed a change learns
// it, and an island's stale introduction is ignored by the others.
func (c *Coordinator) SyncRegistry(ctx context.Context) error {
	self := c.island.BackendHash()
	if self == "" {
		return nil
	}
	mine, _, err := c.island.Endpoints()
	if err != nil {
		return err
	}
	if err := c.syncOwnEntry(ctx, self, mine); err != nil {
		return err
	}
	// Introduce this island to the configured peers, and everything it
	// knows to every island it knows (anti-entropy: an island that joined
	// later learns the others from the first island it talks to). Each
	// island is told in turn, the islands all at once: one that does not
	// answer delays no other.
	rms, all, err := c.registry(ctx)
	if err != nil {
		return err
	}
	// Each island is told through its endpoints in turn (a configured
	// peer through the one given): one that does not answer, such as a
	// member that is down, is passed over for the next.
	type audience struct {
		endpoints []string
		changes   []wireChange
	}
	tell := map[string]*audience{} // by the first endpoint to tell
	add := func(endpoints []string, changes []wireChange) {
		a := tell[endpoints[0]]
		if a == nil {
			a = &audience{}
			tell[endpoints[0]] = a
		}
		if len(endpoints) > len(a.endpoints) {
			a.endpoints = endpoints
		}
		a.changes = append(a.changes, changes...)
	}
	for _, peer := range c.cfg.Peers {
		add([]string{peer}, changesOf(self, all[self], false))
	}
	for _, to := range sortedKeys(rms) {
		if to == self {
			continue
		}
		for _, b := range sortedKeys(all) {
			// An island is told only the removals of its own endpoints:
			// one it still has as a member it registers again.
			add(rms[to].Endpoints, changesOf(b, all[b], b == to))
		}
	}
	errs := eachIsland(sortedKeys(tell), func(first string) error {
		a := tell[first]
		var refused error
		at := 0
		for _, ch := range a.changes {
			for {
				actx, cancel := context.WithTimeout(ctx, c.cfg.FanoutTimeout)
				_, err := c.remote.Register(actx, a.endpoints[at], ch.req, ch.remove)
				cancel()
				switch {
				case err == nil, isReplicationPartial(err):
				case transient(unwrapEnvelope(err)) && at+1 < len(a.endpoints) && ctx.Err() == nil:
					at++ // this endpoint does not answer: the next is told instead
					continue
				case transient(unwrapEnvelope(err)):
					return err // it does not answer: telling it more would only wait longer
				case refused == nil:
					refused = err
				}
				break
			}
		}
		return refused
	})
	if failed := sortedKeys(errs); len(failed) > 0 {
		return errs[failed[0]]
	}
	return nil
}

// syncOwnEntry registers the island's member endpoints missing from its own
// entry and removes the endpoints that are no longer members.
func (c *Coordinator) syncOwnEntry(ctx context.Context, self string, mine []string) error {
	_, all, err := c.registry(ctx)
	if err != nil {
		return err
	}
	have := all[self].Endpoints
	for _, ep := range mine {
		if !slices.Contains(have, ep) {
			if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: self, Endpoint: ep}); err != nil {
				return err
			}
		}
	}
	for _, ep := range have {
		if !slices.Contains(mine, ep) {
			if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: self, Endpoint: ep, Remove: true}); err != nil {
				return err
			}
		}
	}
	return nil
}

// wireChange is a registry change as passed on to another island.
type wireChange struct {
	req    wire.TCRMRegisterRequest
	remove bool
}

// changesOf lists what entry e of island backend records, as changes to
// pass on: its endpoints with the time each was registered (unless
// onlyRemovals), then its removal records with the time of the removal.
func changesOf(backend string, e fsm.RMEntry, onlyRemovals bool) []wireChange {
	var out []wireChange
	if !onlyRemovals {
		for _, ep := range e.Endpoints {
			out = append(out, wireChange{req: wire.TCRMRegisterRequest{BackendHash: backend, Endpoint: ep,
				PassedOn: true, ChangedAtUnixMs: e.Added[ep]}})
		}
	}
	for _, ep := range sortedKeys(e.Removed) {
		out = append(out, wireChange{remove: true, req: wire.TCRMRegisterRequest{BackendHash: backend, Endpoint: ep,
			PassedOn: true, ChangedAtUnixMs: e.Removed[ep]}})
	}
	return out
}

// isReplicationPartial reports a peer that recorded a registration but
// could not pass it on to every island: this island is known there.
func isReplicationPartial(err error) bool {
	e := envelope(unwrapEnvelope(err))
	return e != nil && e.Code == errcode.TCRMReplication.Code
}

// withDefaultPort is endpoint ep (normalized: without its scheme's default
// port) spelled with that port, as servers recorded it before endpoints
// were normalized so.
func withDefaultPort(ep string) string {
	if strings.HasPrefix(ep, "https://") {
		return ep + ":443"
	}
	return ep + ":80"
}
