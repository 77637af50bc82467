// Package sweeper runs on the Raft leader only and turns the passage of time
// into replicated steps: when a lease expires, a queued acquirer's deadline
// passes or a decision record outlives its retention, it proposes a bounded
// sweep command stamped with the leader's clock. Expiry is therefore judged
// once, by the leader, against replicated time, and every node applies the
// same outcome (rollback of the expired lease's transaction and hand-off to
// the next waiter). The sweeper sleeps until the earliest deadline in the
// state instead of polling, and stops as soon as leadership is lost. The
// package's other leader-only loops keep the state bounded the same way,
// through Raft and off the request path: the Pruner frees spent UTXO
// records, the Forgetter key records that hold nothing but a fencing
// counter.
package sweeper

import (
	"context"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/leaderloop"
)

// Proposer replicates a command.
type Proposer interface {
	Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error)
}

// Schedule tells when the next sweep has work.
type Schedule interface {
	NextDeadline(retentionMs int64) (when int64, ok bool)
}

// Clock is the leader's clock, the same one that stamps commands.
type Clock interface{ Now() time.Time }

// Formats tells which entry format's rules the island follows
// (fsm.FSM.Rules) and whether every server applies this build's format.
type Formats interface {
	Rules() int
	EveryServerApplies() bool
}

// Config bounds the sweeper's work.
type Config struct {
	Limit        int           // items per sweep entry
	TxnRetention time.Duration // how long decision records are kept
	Idle         time.Duration // longest sleep when nothing is scheduled
	// Formats, when set, lets sweeps raise the island's rules to this
	// build's entry format once every server applies it (SweepCmd.Format).
	Formats Formats
	Logger  *slog.Logger
}

// Sweeper is started and stopped by leadership changes.
type Sweeper struct {
	proposer Proposer
	schedule Schedule
	clock    Clock
	cfg      Config

	kick    chan struct{}
	planned atomic.Int64 // Unix ms of the planned wake-up

	leaderloop.Loop
	sweeps atomic.Int64
}

// New returns a stopped sweeper.
func New(p Proposer, s Schedule, c Clock, cfg Config) *Sweeper {
	if cfg.Limit <= 0 {
		cfg.Limit = 256
	}
	if cfg.Idle <= 0 {
		cfg.Idle = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sw := &Sweeper{proposer: p, schedule: s, clock: c, cfg: cfg, kick: make(chan struct{}, 1)}
	sw.planned.Store(math.MaxInt64)
	return sw
}

// SetLeader starts the sweeper when this node gains leadership and stops it
// when leadership is lost. It does not block.
func (s *Sweeper) SetLeader(isLeader bool) { s.Set(isLeader, s.run) }

// Sweeps counts the sweep entries proposed.
func (s *Sweeper) Sweeps() int64 { return s.sweeps.Load() }

// Observe implements fsm.Observer: a new deadline earlier than the planned
// wake-up, or a restored state, wakes the loop so it can re-plan.
func (s *Sweeper) Observe(events []fsm.Event) {
	for _, e := range events {
		if e.Kind == fsm.EventRestored || e.Kind == fsm.EventTimer && e.When < s.planned.Load() {
			select {
			case s.kick <- struct{}{}:
			default:
			}
			return
		}
	}
}

// retentionSlack is how long a record whose retention ended (a decision,
// how a delivery ended, an idempotent enqueue) may wait to be forgotten:
// the records falling due within it are forgotten by one sweep, instead of
// each by a sweep entry of its own, which under a steady stream of
// requests would add about one Raft entry per transaction.
const retentionSlack = time.Second

func (s *Sweeper) run(ctx context.Context) {
	retention := s.cfg.TxnRetention.Milliseconds()
	// A new term starts with a sweep: whatever fell due while no leader
	// was sweeping is handled at once.
	force := true
	for {
		now := s.clock.Now().UnixMilli()
		next, ok := s.schedule.NextDeadline(retention + retentionSlack.Milliseconds())
		format := s.format()
		if force || format != 0 || (ok && next <= now) {
			force = false
			res, err := s.proposer.Propose(ctx, &fsm.Command{Op: fsm.OpSweep,
				Sweep: &fsm.SweepCmd{Limit: s.cfg.Limit, TxnRetention: retention, Format: format}})
			if ctx.Err() != nil {
				return
			}
			s.sweeps.Add(1)
			if err != nil {
				s.cfg.Logger.Warn("sweep failed", "error", err)
				if !sleep(ctx, 100*time.Millisecond) {
					return
				}
				continue
			}
			// More work is due at once (the records past their retention
			// too, which the plan sees only after the slack); else re-plan
			// against the new state.
			force = res.Sweep != nil && res.Sweep.More
			continue
		}
		wait := s.cfg.Idle
		if ok {
			wait = min(wait, time.Duration(next-now)*time.Millisecond)
		}
		s.planned.Store(now + wait.Milliseconds())
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.kick:
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
		s.planned.Store(math.MaxInt64)
	}
}

// format is this build's entry format when the island should adopt its
// rules (every server applies it, the island follows an older one), else 0.
func (s *Sweeper) format() int {
	f := s.cfg.Formats
	if f == nil || !f.EveryServerApplies() || f.Rules() >= fsm.EntryFormat {
		return 0
	}
	return fsm.EntryFormat
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
