package tc

import (
	"context"
	"slices"
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

// Rounds counts the completed rounds (for tests and metrics).
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

func (r *Resolver) run(ctx context.Context) {
	backoff := map[string]retry{}
	var lastRegistry time.Time
	for {
		now := r.c.clock.Now()
		if now.Sub(lastRegistry) >= r.registry || r.c.learned.Swap(false) {
			if err := r.c.SyncRegistry(ctx); err != nil && ctx.Err() == nil {
				r.c.cfg.Logger.Warn("registering this island with the others failed", "error", err)
			} else {
				lastRegistry = now
			}
		}
		next := r.round(ctx, backoff)
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
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// round does the work that is due and returns when the next is (zero:
// nothing scheduled). Work that is backing off is passed over, so that it
// never holds up what comes after it.
func (r *Resolver) round(ctx context.Context, backoff map[string]retry) (next time.Time) {
	const batch, scan = 64, 10000
	now := r.c.clock.Now()
	plan := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	// pick collects due work that is not backing off.
	pick := func(kind string, out *[]string) func(id string) bool {
		seen := 0
		return func(id string) bool {
			seen++
			if b, ok := backoff[kind+id]; ok && now.Before(b.at) {
				plan(b.at)
			} else {
				*out = append(*out, id)
			}
			return len(*out) < batch && seen < scan
		}
	}
	var fan, doubt []string
	var nextDoubt int64
	var hasDoubt bool
	err := r.c.store.Read(ctx, func(v *fsm.View) error {
		v.FanoutEach(pick("fanout/", &fan))
		v.DoubtEach(now.UnixMilli(), pick("doubt/", &doubt))
		nextDoubt, hasDoubt = v.NextDoubt()
		return nil
	})
	if err != nil {
		return now.Add(r.interval)
	}
	// The work runs at once, so that an island that does not answer holds
	// up only the work it is part of; the backoff is settled afterwards.
	type job struct {
		key string
		do  func() error
	}
	var jobs []job
	for _, id := range fan {
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
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { errs[i] = j.do() })
	}
	wg.Wait()
	for i, j := range jobs {
		if errs[i] == nil {
			delete(backoff, j.key)
			continue
		}
		b := backoff[j.key]
		b.delay = min(max(b.delay*2, r.c.cfg.FanoutBaseDelay), time.Minute)
		b.at = r.c.clock.Now().Add(b.delay)
		backoff[j.key] = b
		plan(b.at)
		if ctx.Err() == nil {
			r.c.cfg.Logger.Warn("transaction not finished yet; retrying", "work", j.key, "retry_in", b.delay, "error", errs[i])
		}
	}
	if hasDoubt && nextDoubt > now.UnixMilli() {
		plan(time.UnixMilli(nextDoubt))
	}
	if len(fan) == batch || len(doubt) == batch {
		plan(now) // more is due right away
	}
	// Forget the backoff of work that is long gone.
	for key, b := range backoff {
		if now.Sub(b.at) > 2*time.Minute {
			delete(backoff, key)
		}
	}
	return next
}

// Register adds (or removes) an RM endpoint of island backend in this
// island's registry through Raft, and passes the change on to every other
// island in the registry, so that islands learn about each other. When
// the change cannot be replicated everywhere it answers
// tc_rm_replication_failed (what was recorded stays). An operator's
// request is passed on even when this island has the change already, so
// that retrying it reaches the islands that missed it; a change passedOn
// by another island goes further only when it changed something here,
// which ends the passing on.
func (c *Coordinator) Register(ctx context.Context, backend, endpoint string, remove, passedOn bool) (fsm.RMInfo, error) {
	rms, err := c.RMs(ctx)
	if err != nil {
		return fsm.RMInfo{}, errcode.TCRMReplication.With("reading the registry: %v", err)
	}
	info := fsm.RMInfo{Backend: backend, Entry: rms[backend]}
	if slices.Contains(info.Entry.Endpoints, endpoint) == remove {
		res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRMRegister,
			RMRegister: &fsm.RMRegisterCmd{Backend: backend, Endpoint: endpoint, Remove: remove}})
		if err != nil {
			if e := envelope(err); e != nil && e.Code == errcode.MalformedCmd.Code {
				return fsm.RMInfo{}, errcode.InvalidParams.With("%s", e.Detail)
			}
			return fsm.RMInfo{}, errcode.TCRMReplication.With("recording the registration: %v", err)
		}
		info = *res.RM
	}
	if !info.Changed && passedOn {
		return info, nil
	}
	if _, known := rms[backend]; !known && info.Changed {
		c.learned.Store(true)
	}
	self := c.island.BackendHash()
	var others []string
	for _, b := range sortedKeys(rms) {
		if b != self && b != backend {
			others = append(others, b)
		}
	}
	errs := eachIsland(others, func(b string) error {
		return c.atIsland(ctx, b, func(ctx context.Context, ep string) error {
			_, err := c.remote.Register(ctx, ep, wire.TCRMRegisterRequest{BackendHash: backend, Endpoint: endpoint, PassedOn: true}, remove)
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

// SyncRegistry records this island's member endpoints in its own registry
// and registers them with every other island it knows (the configured
// peers and the registry's islands).
func (c *Coordinator) SyncRegistry(ctx context.Context) error {
	self := c.island.BackendHash()
	if self == "" {
		return nil
	}
	mine, _, err := c.island.Endpoints()
	if err != nil {
		return err
	}
	rms, err := c.RMs(ctx)
	if err != nil {
		return err
	}
	have := rms[self].Endpoints
	for _, ep := range mine {
		if !slices.Contains(have, ep) {
			if _, err := c.Register(ctx, self, ep, false, false); err != nil {
				return err
			}
		}
	}
	for _, ep := range have {
		if !slices.Contains(mine, ep) {
			if _, err := c.Register(ctx, self, ep, true, false); err != nil {
				return err
			}
		}
	}
	// Introduce this island to the configured peers, and everything it
	// knows to every island it knows (anti-entropy: an island that joined
	// later learns the others from the first island it talks to). Each
	// island is told in turn, the islands all at once: one that does not
	// answer delays no other.
	type intro struct {
		backend string
		eps     []string
	}
	tell := map[string][]intro{}
	for _, peer := range c.cfg.Peers {
		tell[peer] = append(tell[peer], intro{self, mine})
	}
	if rms, err = c.RMs(ctx); err != nil {
		return err
	}
	for _, to := range sortedKeys(rms) {
		if to == self || len(rms[to].Endpoints) == 0 {
			continue
		}
		at := rms[to].Endpoints[0]
		for _, b := range sortedKeys(rms) {
			if b != to {
				tell[at] = append(tell[at], intro{b, rms[b].Endpoints})
			}
		}
	}
	errs := eachIsland(sortedKeys(tell), func(at string) error {
		var first error
		for _, in := range tell[at] {
			for _, ep := range in.eps {
				actx, cancel := context.WithTimeout(ctx, c.cfg.FanoutTimeout)
				_, err := c.remote.Register(actx, at, wire.TCRMRegisterRequest{BackendHash: in.backend, Endpoint: ep, PassedOn: true}, false)
				cancel()
				switch {
				case err == nil, isReplicationPartial(err):
				case transient(unwrapEnvelope(err)):
					return err // it does not answer: telling it more would only wait longer
				case first == nil:
					first = err
				}
			}
		}
		return first
	})
	if failed := sortedKeys(errs); len(failed) > 0 {
		return errs[failed[0]]
	}
	return nil
}

// isReplicationPartial reports a peer that recorded a registration but
// could not pass it on to every island: this island is known there.
func isReplicationPartial(err error) bool {
	e := envelope(unwrapEnvelope(err))
	return e != nil && e.Code == errcode.TCRMReplication.Code
}
